"""Shared helpers: paths, the command line run in this process, and a uniform-cost engine input builder."""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import io
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import settings

from mpsim.engine import EngineInput
from mpsim.schedules import Schedule

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"

# Property tests draw the same examples on every run (derandomize: a seed derived from each
# test), so a red CI can be rerun and read; no per-example deadline, since a loaded 2-core CI
# machine runs an example several times slower than a workstation. HYPOTHESIS_PROFILE=explore
# draws fresh examples, for looking for new failures on purpose.
settings.register_profile("mpsim", derandomize=True, deadline=None, database=None)
settings.register_profile("explore", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "mpsim"))

@dataclass(frozen=True)
class CliRun:
    """What ``mpsim ARGV`` run in this process gave: its exit code (None: it ran past the limit) and output."""

    returncode: int | None
    stdout: str
    stderr: str


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang()


def run_in_process(argv, cwd, limit_s: int = 60) -> CliRun:
    """``mpsim ARGV`` run in this process from ``cwd``, as a shell would run it.

    Starting Python and importing mpsim costs about a second per command, which a few
    hundred command-line checks would pay again and again; an exception that escapes the
    command fails the test as a traceback would. What only a real process shows (the
    entry point, a warning printed at import) is checked by a few tests that start one.
    """
    from mpsim.cli.main import main

    err, out = io.StringIO(), io.StringIO()
    previous = os.getcwd()
    handler = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(limit_s)
    try:
        os.chdir(cwd)
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            try:
                code = main([str(arg) for arg in argv])
            except SystemExit as exc:  # argparse's errors and --help
                code = exc.code if isinstance(exc.code, int) else 2
    except _Hang:
        code = None
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, handler)
        os.chdir(previous)
    return CliRun(code, out.getvalue(), err.getvalue())


# a 1.3B GPT: small enough that every layout fits on 8 A100 and a whole plan runs in seconds
TINY_MODEL = """\
name: gpt-1.3b
num_layers: 24
hidden_size: 2048
ffn_hidden_size: 8192
num_attention_heads: 16
vocab_size: 51200
seq_length: 2048
"""


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module (once), its sibling modules importable as it imports them.

    Registered under its own name before it runs: dataclasses defined in it look their
    module up by that name.
    """
    if name not in sys.modules:
        benchmarks = str(ROOT / "benchmarks")
        if benchmarks not in sys.path:
            sys.path.insert(0, benchmarks)
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


def benchmark_error_line(module: ModuleType, capsys) -> tuple[str, float]:
    """Run a benchmark's ``main()`` (it must succeed) and read its last line: (the line, its
    ``mean_abs_error_pct``), for the tests that hold a benchmark to its documented error."""
    assert module.main() == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    return last, float(last.split("mean_abs_error_pct=")[1].split()[0])


# ops that make a view of a tensor (no kernel), left out of dispatch counts
VIEW_OPS = {"view", "_unsafe_view", "expand", "t", "transpose", "detach", "alias", "as_strided", "squeeze",
            "unsqueeze", "slice", "select", "permute", "reshape", "split", "split_with_sizes"}


def dispatch_counter(min_numel: int):
    """A context that counts what PyTorch dispatches inside it: ``kernels`` (every op but views)
    and ``bytes`` (of each tensor of at least ``min_numel`` elements a kernel reads or writes)."""
    torch = pytest.importorskip("torch")
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.kernels, self.bytes = 0, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.overloadpacket.__name__ not in VIEW_OPS:
                self.kernels += 1
                self.bytes += sum(t.numel() * t.element_size() for t in tree_flatten((args, kwargs, out))[0]
                                  if isinstance(t, torch.Tensor) and t.numel() >= min_numel)
            return out

    return Count()


def registered_schedule(name: str, pp: int, vpp: int, microbatches: int) -> Schedule:
    """A registered schedule at sizes a hypothesis test drew, checked; the draw is discarded where
    the schedule refuses those sizes."""
    from hypothesis import assume

    from mpsim.engine import rank_spans
    from mpsim.schedules import ScheduleError, build_schedule

    try:
        return build_schedule(name, pp, vpp, microbatches, check=True, timer=rank_spans)
    except ScheduleError:
        assume(False)
        raise  # not reached: assume(False) ends the example


def uniform_input(schedule: Schedule, forward_s: float = 1.0, backward_s: float = 2.0, weight_s: float | None = None,
                  transfer_s: float = 0.0, **options) -> EngineInput:
    """Engine input where every stage costs the same (the closed-form bubble setting)."""
    weight_s = backward_s / 2 if weight_s is None else weight_s
    action_s = {}
    for stage in range(schedule.num_stages):
        action_s[(stage, "F")] = forward_s
        action_s[(stage, "B")] = backward_s
        action_s[(stage, "I")] = backward_s - weight_s
        action_s[(stage, "W")] = weight_s
    transfers = {}
    for stage in range(schedule.num_stages - 1):
        transfers[(stage, stage + 1)] = transfers[(stage + 1, stage)] = transfer_s
    return EngineInput(schedule=schedule, action_s=action_s, transfer_s=transfers, **options)


@pytest.fixture(autouse=True)
def _working_folder_kept():
    """Every test ends in the folder it started in. One that leaves another, or removes it,
    errors here by name, and the tests after it run from the same folder as before (a removed
    working folder fails every later scenario load, far from its cause)."""
    try:
        before = os.getcwd()
    except FileNotFoundError:  # removed outside any test's watch: run on from the checkout
        os.chdir(ROOT)
        pytest.fail(f"the working folder was removed before this test began; the tests go on from {ROOT}")
    yield
    try:
        after = os.getcwd()
    except FileNotFoundError:
        after = "a folder that no longer exists"
    if after != before:
        os.chdir(before)
        pytest.fail(f"the test left the working folder at {after}, not {before}")


# the folder of one run's machine locks: made by the process that starts the run (pytest_configure)
# before it starts its workers, which find it in their environment
LOCKS_FOLDER_ENV = "MPSIM_TEST_LOCKS"
_LOCKS_MADE = pytest.StashKey[str]()


def _machine_lock_paths() -> tuple[Path, Path] | None:
    """(gate, lock) files shared by the workers of one parallel run; None in a serial run."""
    folder = os.environ.get(LOCKS_FOLDER_ENV)
    if folder is None or "PYTEST_XDIST_WORKER" not in os.environ:
        return None
    return Path(folder) / "gate", Path(folder) / "lock"


@contextlib.contextmanager
def _machine_share(alone: bool):
    """Hold this worker's share of the machine: all of it for a test marked ``alone``.

    The suite runs on several workers (pytest-xdist, ``-n auto``), but a test that times
    this machine (the calibration job measures ops and training steps for minutes) must
    run with the other workers idle, or it measures them. Every test holds a shared lock
    while it runs, a test marked ``alone`` the exclusive one. Before its shared lock a
    test passes through a gate that the exclusive holder closes first, so a waiting
    ``alone`` test is not starved by the tests of other workers starting one after another.
    """
    paths = _machine_lock_paths()
    if paths is None:
        yield
        return
    gate_path, lock_path = paths
    with open(gate_path, "a") as gate, open(lock_path, "a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        if alone:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the tests running now finish; the gate holds back the rest
        else:
            fcntl.flock(gate, fcntl.LOCK_UN)
            fcntl.flock(lock, fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Each test, with its fixtures' setup and teardown, under its share of the machine
    (``_machine_share``): a module's fixture that measures runs inside its first test's share.
    Outermost (``tryfirst``), so the wait for a share is not counted against the test's time limit."""
    with _machine_share(alone=item.get_closest_marker("alone") is not None):
        yield


def pytest_configure(config):
    if not hasattr(config, "workerinput") and LOCKS_FOLDER_ENV not in os.environ:
        config.stash[_LOCKS_MADE] = os.environ[LOCKS_FOLDER_ENV] = tempfile.mkdtemp(prefix="mpsim-tests-")


def pytest_unconfigure(config):
    # only the process that made the folder removes it, after its workers have all ended: a
    # worker that removed the files while others ran would let them lock different files
    folder = config.stash.get(_LOCKS_MADE, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
        os.environ.pop(LOCKS_FOLDER_ENV, None)


@pytest.fixture
def scenarios_dir() -> Path:
    return SCENARIOS


def child_processes(pid: int) -> list[int]:
    """Processes ``pid`` started that still run (Linux; none elsewhere)."""
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                found.extend(int(child) for child in handle.read().split())
        except OSError:
            continue
    return found


def pytest_sessionfinish(session, exitstatus):
    """No process a test started outlives the run: one left would keep the run's output open
    (and CI waiting on it) after pytest ends. Those found are named and stopped."""
    for pid in child_processes(os.getpid()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                command = handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
            if "multiprocessing.forkserver" in command or "multiprocessing.resource_tracker" in command:
                continue  # Python's own helpers: they end when this process does
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
        print(f"\nconftest: stopped process {pid} that a test left running: {command[:200]}", file=sys.stderr)
