"""How much each op kind's time varies from one run of it to the next, and where the figure comes from.

The variation is one coefficient of variation (standard deviation over mean) per op kind:
GEMMs, attention kernels, memory-bound kernels, collectives and pipeline transfers. A
figure belongs in ``PUBLISHED_CV`` only with a published measurement of that quantity
behind it, named in a comment next to it.

The figures in the table are measured on published profiler traces of real A100
training runs (Holistic Trace Analysis test data, github.com/facebookresearch/
HolisticTraceAnalysis ``tests/data``, commit f4d0062, MIT licence): the same kernel's
time from one training step to the next, per kind, as ``benchmarks/trace_variation.py``
prints it (the method: ``mpsim/traces/variation.py``). GEMMs and memory-bound kernels
only:

* attention: the traces have no attention kernels;
* collectives: an NCCL kernel's time includes its wait for the slowest peer (6 % and 41 %
  step-to-step in the two devices' traces), which the order statistics over replicas
  already model (``order_stats.py``); taking it as the op's own variation would count
  the straggling twice;
* pipeline transfers: a trace does not tell them from other NCCL send/receive kernels.

Other published figures measure something else:

* Sinha et al., "Not All GPUs Are Created Equal" (SC22, arXiv 2208.11035), report an
  average performance variation of 8 % (22 % at most) across nominally identical V100 and
  MI60 GPUs of four clusters, with outliers 1.5x slower than the median GPU. That is a
  spread of whole-application throughput between devices (max over median), not a
  per-kernel coefficient of variation, and it is not split by op kind.
* The Llama 3 paper (arXiv 2407.21783, section 3.3.4) reports a 1-2 % throughput swing
  over a day from temperature, again for the whole job.

A kind without a figure must be given by the scenario (``variability.cv``) or a
``--set variability.cv.KIND=...`` override before ``mpsim run --samples`` draws anything.
"""

from __future__ import annotations

from mpsim.errors import InputError
from mpsim.specs.scenario import Scenario

# op kinds, in the order they are reported; "transfer" is a pipeline send between stages
OP_KINDS = ("gemm", "attention", "memory", "collective", "transfer")

# accelerator name -> {op kind: coefficient of variation}, each with its source in a comment.
PUBLISHED_CV: dict[str, dict[str, float]] = {
    # HTA-TRACES negative_queue_length_values_check/rank0 (NVIDIA A100-SXM4-80GB, 5 steps of a
    # 16-rank recommendation model): benchmarks/trace_variation.py
    "a100-sxm-80gb": {"gemm": 0.0051, "memory": 0.0122},
    # HTA-TRACES trace_diff/control and nccl_parser_config (NVIDIA A100-PG509-200, the 40 GB SXM4
    # board: 108 SMs, 42.5 GB in the traces' deviceProperties; 6 and 3 steps), pooled:
    # benchmarks/trace_variation.py
    "a100-sxm-40gb": {"gemm": 0.0082, "memory": 0.0084},
}


def op_cvs(scenario: Scenario) -> dict[str, float]:
    """The coefficient of variation of every op kind: the scenario's, else the published one.

    A kind with neither is an input error naming the field to set.
    """
    given = scenario.variability.cv if scenario.variability is not None else None
    published = PUBLISHED_CV.get(scenario.cluster.system.accelerator.name, {})
    found: dict[str, float] = {}
    missing = []
    for kind in OP_KINDS:
        value = getattr(given, kind) if given is not None else None
        if value is None:
            value = published.get(kind)
        if value is None:
            missing.append(kind)
        else:
            found[kind] = float(value)
    if missing:
        fields = ", ".join(f"variability.cv.{kind}" for kind in missing)
        raise InputError(f"no published coefficient of variation for {', '.join(missing)} on "
                         f"{scenario.cluster.system.accelerator.name}; give {fields} in the scenario "
                         f"or with --set (docs/reliability.md)", field="variability.cv")
    return found
