"""How much each op kind's time varies from one run of it to the next, and where the figure comes from.

The variation is one coefficient of variation (standard deviation over mean) per op kind:
GEMMs, attention kernels, memory-bound kernels, collectives and pipeline transfers. A
figure belongs in ``PUBLISHED_CV`` only with a published measurement of that quantity
behind it, named in a comment next to it.

No such figure is in the table yet. What is published measures something else:

* Sinha et al., "Not All GPUs Are Created Equal" (SC22, arXiv 2208.11035), report an
  average performance variation of 8 % (22 % at most) across nominally identical V100 and
  MI60 GPUs of four clusters, with outliers 1.5x slower than the median GPU. That is a
  spread of whole-application throughput between devices (max over median), not a
  per-kernel coefficient of variation, and it is not split by op kind.
* The Llama 3 paper (arXiv 2407.21783, section 3.3.4) reports a 1-2 % throughput swing
  over a day from temperature, again for the whole job.

Turning either into a per-kind coefficient of variation would need a distribution shape
they do not give, so every kind must be given by the scenario (``variability.cv``) or a
``--set variability.cv.KIND=...`` override before ``mpsim run --samples`` draws anything.
"""

from __future__ import annotations

from mpsim.errors import InputError
from mpsim.specs.scenario import Scenario

# op kinds, in the order they are reported; "transfer" is a pipeline send between stages
OP_KINDS = ("gemm", "attention", "memory", "collective", "transfer")

# accelerator name -> {op kind: coefficient of variation}, each with its source in a comment.
# Empty: no published per-kind figure was found (see the module docstring).
PUBLISHED_CV: dict[str, dict[str, float]] = {}


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
