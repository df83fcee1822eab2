"""Run the bad-input corpus (benchmarks/robustness_corpus.py), each case in its own process.

Each case runs ``python -m mpsim ...`` in a fresh folder holding its files, with a time
limit (60 s by default), and is judged: clean (the exit code and the one line it must
print), traceback, hang (past the limit), accepted (a bad input exited 0), wrong-exit or
wrong-line. Prints the cases that were not clean, then the last line
``cases=<n> clean=<c> traceback=<t> hang=<h> accepted=<a>``.

    python benchmarks/robustness.py [--limit-s 60] [--workers 2] [--only TEXT]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from robustness_corpus import Case, cases, judge, write_files  # noqa: E402


def run_case(case: Case, limit_s: float) -> tuple[str, int | None, str]:
    with tempfile.TemporaryDirectory(prefix="mpsim-corpus-") as folder:
        write_files(case, Path(folder))
        try:
            done = subprocess.run([sys.executable, "-m", "mpsim", *case.argv], cwd=folder, capture_output=True,
                                  text=True, timeout=limit_s, env={**os.environ, "MPSIM_PROGRESS": "0"})
        except subprocess.TimeoutExpired:
            return "hang", None, ""
        return judge(case, done.returncode, done.stderr), done.returncode, done.stderr


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit-s", type=float, default=60.0, help="time limit per case (default 60 s)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="cases run at once")
    parser.add_argument("--only", help="run only the cases whose id contains this text")
    args = parser.parse_args(argv)
    corpus = [case for case in cases() if not args.only or args.only in case.id]
    start = time.perf_counter()
    verdicts: Counter = Counter()
    with ThreadPoolExecutor(args.workers) as pool:
        futures = [(case, pool.submit(run_case, case, args.limit_s)) for case in corpus]
        for number, (case, future) in enumerate(futures, 1):
            verdict, code, stderr = future.result()
            verdicts[verdict] += 1
            if verdict != "clean":
                last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
                print(f"[{number}/{len(corpus)}] {verdict}: {case.id} (exit {code}, wanted {case.exit} with "
                      f"{list(case.expect)}): {last[:200]}")
    print(f"{len(corpus)} cases in {time.perf_counter() - start:.0f} s: " +
          ", ".join(f"{name} {count}" for name, count in sorted(verdicts.items())))
    print(f"cases={len(corpus)} clean={verdicts['clean']} traceback={verdicts['traceback']} hang={verdicts['hang']} "
          f"accepted={verdicts['accepted']}")
    return 0 if verdicts["clean"] == len(corpus) else 1


if __name__ == "__main__":
    sys.exit(main())
