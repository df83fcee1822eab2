"""Schedule names, their generators and what they need of the layout."""

from __future__ import annotations

from dataclasses import dataclass, replace

from mpsim.schedules.actions import Schedule
from mpsim.schedules.dualpipe import dualpipe, dualpipev
from mpsim.schedules.generators import Generator, gpipe, interleaved_1f1b, looped_bfs, one_f_one_b
from mpsim.schedules.zb_search import Timer, zb_1p_unit, zb_2p_unit
from mpsim.schedules.zero_bubble import interleaved_zero_bubble, zb_h1, zb_h2, zbv


@dataclass(frozen=True)
class ScheduleKind:
    """A registered schedule: its generator and the chunks per rank it accepts."""

    generator: Generator
    min_vpp: int
    max_vpp: int | None  # None: no upper limit
    description: str
    chains: int = 1  # pipelines the stages form (chains.py); each carries its share of the layer blocks
    searched: bool = False  # built by a search that times candidates: the generator takes a Timer too

    def check_vpp(self, name: str, vpp: int) -> str | None:
        """Why ``vpp`` does not fit, or None."""
        if self.min_vpp == self.max_vpp and vpp != self.min_vpp:
            return f"{name} runs exactly {self.min_vpp} chunk(s) per rank; set parallel.vpp to {self.min_vpp}"
        if vpp < self.min_vpp:
            return f"{name} needs virtual stages: set parallel.vpp to {self.min_vpp} or more"
        if self.max_vpp is not None and vpp > self.max_vpp:
            return f"{name} runs one stage per rank, but parallel.vpp={vpp}; set vpp to 1"
        return None


SCHEDULES: dict[str, ScheduleKind] = {
    "gpipe": ScheduleKind(gpipe, 1, 1, "all forwards, then all backwards (Huang et al. 2019)"),
    "1f1b": ScheduleKind(one_f_one_b, 1, 1, "one forward, one backward (PipeDream-Flush, Narayanan et al. 2021)"),
    "interleaved-1f1b": ScheduleKind(interleaved_1f1b, 2, None, "Megatron's interleaved 1F1B, depth first"),
    "looped-bfs": ScheduleKind(looped_bfs, 1, None, "breadth-first over chunks (Lamy-Poirier 2023)"),
    "zb-h1": ScheduleKind(zb_h1, 1, 1, "zero bubble, 1F1B memory (Qi et al. 2024)"),
    "zb-h2": ScheduleKind(zb_h2, 1, 1, "zero bubble, 2p-1 microbatches of memory (Qi et al. 2024)"),
    "zb-1p": ScheduleKind(zb_1p_unit, 1, 1, "zero bubble searched for the stage times, memory of p microbatches (Qi et al. 2024)",
                          searched=True),
    "zb-2p": ScheduleKind(zb_2p_unit, 1, 1, "zero bubble searched for the stage times, memory of 2p microbatches (Qi et al. 2024)",
                          searched=True),
    "interleaved-zb": ScheduleKind(interleaved_zero_bubble, 1, None, "interleaved 1F1B with split backward (torch ZB1P)"),
    "zbv": ScheduleKind(zbv, 2, 2, "zero bubble in a V of two chunks per rank (Qi et al. 2024)"),
    "dualpipev": ScheduleKind(dualpipev, 2, 2, "DualPipe in a V, overlapped forward+backward (DeepSeek-V3)"),
    "dualpipe": ScheduleKind(dualpipe, 2, 2, "bidirectional DualPipe: two pipelines, two copies of the blocks "
                                             "(DeepSeek-V3)", chains=2),
}

ALIASES = {
    "1f1b-interleaved": "interleaved-1f1b", "interleaved": "interleaved-1f1b", "1f1b-i": "interleaved-1f1b",
    "interleaved1f1b": "interleaved-1f1b", "pipedream-flush": "1f1b", "bfs": "looped-bfs", "loopedbfs": "looped-bfs",
    "zb1p": "interleaved-zb", "interleavedzerobubble": "interleaved-zb", "zb-v": "zbv", "zbvzerobubble": "zbv",
    "dualpipe-v": "dualpipev", "zbh1": "zb-h1", "zbh2": "zb-h2", "zb2p": "zb-2p",
}


def canonical_name(name: str) -> str:
    """The registry name of a schedule, accepting aliases, torch's class names and any case."""
    key = name.strip().lower().replace("_", "-")
    if key.startswith("schedule") and key != "schedule":  # torch's class names: ScheduleGPipe, ...
        key = key.removeprefix("schedule").lstrip("-")
    if key in SCHEDULES:  # before the dash-free aliases: "zb-1p" is not torch's ZB1P
        return key
    return ALIASES.get(key, ALIASES.get(key.replace("-", ""), key))


def chunks_per_rank(name: str, vpp: int) -> int:
    """The model chunks per rank schedule ``name`` runs when compared with others at ``vpp``
    (``mpsim compare``): ``vpp`` when the schedule allows it, else the nearest it allows.

    A schedule that interleaves any number of chunks (interleaved 1F1B, looped BFS,
    interleaved zero bubble) runs at least two: with one chunk it is not interleaved and
    repeats a row of the comparison (looped BFS is then GPipe, interleaved zero bubble runs
    ZB-H1's step), which torch allows but a comparison of schedules gains nothing from.
    """
    kind = SCHEDULES[canonical_name(name)]
    if kind.max_vpp is not None and vpp > kind.max_vpp:
        return kind.max_vpp
    return max(vpp, kind.min_vpp, 2 if kind.max_vpp is None else 1)


def stage_chains(name: str, pp: int, vpp: int) -> tuple[int, ...]:
    """Chain lengths a registered schedule's stages form ((): one chain); () for files and unknown names."""
    kind = SCHEDULES.get(canonical_name(name)) if not name.startswith("file:") else None
    if kind is None or kind.chains == 1 or (pp * vpp) % kind.chains or kind.check_vpp(name, vpp):
        return ()  # one chain, or a layout the generator refuses with its own message
    return (pp * vpp // kind.chains,) * kind.chains


# the schedules that take Megatron-Core's --microbatch-group-size-per-virtual-pipeline-stage
GROUPED = ("interleaved-1f1b",)


def generate(name: str, pp: int, vpp: int, num_microbatches: int, timer: Timer | None = None,
             microbatch_group_size: int | None = None, combined: bool = False) -> Schedule:
    """Run a registered generator (ValueError with the reason when the layout does not fit).

    A searched schedule needs ``timer``, the timing of fixed schedules it compares
    candidates with (``mpsim.engine.rank_spans``). ``microbatch_group_size`` (None: the
    schedule's default) is for the schedules in ``GROUPED`` only. ``combined``: Megatron-Core's
    combined 1F1B (``training.overlap_moe_expert_parallel_comm``), which it runs in its
    interleaved schedule, or without pipelining when ``pp`` is 1 (``combined_problem``).
    """
    kind = SCHEDULES[name]
    problem = kind.check_vpp(name, vpp)
    if problem:
        raise ValueError(problem)
    if combined:
        problem = combined_problem(name, pp, vpp)
        if problem:
            raise ValueError(problem)
        schedule = interleaved_1f1b(pp, vpp, num_microbatches, microbatch_group_size, combined=True)
        return schedule if name == schedule.name else replace(schedule, name=name)
    if microbatch_group_size is not None:
        if name not in GROUPED:
            raise ValueError(f"microbatch_group_size is Megatron-Core's option of its interleaved schedule; "
                             f"{name} does not take it (use {', '.join(GROUPED)}, or leave it unset)")
        return kind.generator(pp, vpp, num_microbatches, microbatch_group_size)
    if kind.searched:
        if timer is None:
            raise TypeError(f"{name} is searched: pass the engine's timing function (mpsim.engine.rank_spans)")
        return kind.generator(pp, vpp, num_microbatches, timer)
    return kind.generator(pp, vpp, num_microbatches)


def combined_problem(name: str, pp: int, vpp: int) -> str | None:
    """Why Megatron-Core would not run its combined 1F1B on this schedule and layout, or None.

    It pairs forwards and backwards in its interleaved schedule, and in its schedule without
    pipelining (one rank: 1F1B and interleaved 1F1B are the same order there); with
    ``pp > 1`` it asks for virtual stages (TransformerConfig's check of
    overlap_moe_expert_parallel_comm, megatron/core/transformer/transformer_config.py).
    """
    if name not in ("interleaved-1f1b", "1f1b"):
        return (f"Megatron-Core overlaps the expert all-to-alls of paired passes in its interleaved 1F1B "
                f"(or with pp=1); parallel.schedule is {name}")
    if pp > 1 and vpp < 2:
        return (f"Megatron-Core overlaps the expert all-to-alls of paired passes only with virtual stages when "
                f"pp > 1 (pp={pp}): set parallel.schedule: interleaved-1f1b and parallel.vpp to 2 or more")
    return None
