"""Interruption rates per component, from the one large run that published them by cause.

The Llama 3 paper (Dubey et al., "The Llama 3 Herd of Models", arXiv 2407.21783,
section 3.3.4 and Table 5) counts 419 unexpected interruptions in a 54-day snapshot of
pre-training Llama 3 405B on up to 16,384 H100 GPUs (2,048 eight-GPU hosts), with the
root cause of each (47 planned interruptions, for maintenance, are not counted here).
Table 5's rows, grouped by the component that failed:

=========  ===========================================================================  =====
component  Table 5 rows (interruptions)                                                  total
=========  ===========================================================================  =====
gpu        faulty GPU 148, GPU HBM3 memory 72, GPU SRAM memory 19, GPU system             268
           processor 17, silent data corruption 6, GPU thermal interface + sensor 6
host       host maintenance 32, SSD 3, power supply 3, server chassis 2, IO expansion     46
           board 2, CPU 2, system memory 2
nic        NIC 7                                                                           7
switch     network switch/cable 35                                                        35
software   software bug 54, NCCL watchdog timeouts 7, dependency 2                        63
=========  ===========================================================================  =====

The rows add up to 419. (The paper prints 30.1 % beside the 148 faulty-GPU
interruptions; 148 of 419 is 35.3 %. The counts are used here, not the percentages.)

Each count becomes a rate per component-hour by dividing by the snapshot's exposure:
54 days x 24 h times the number of components, taking the whole snapshot at the full
16,384 GPUs (the paper says "up to"; a smaller average size would make every rate
higher). GPUs, NICs (one 400 Gb/s NIC per GPU on Meta's hosts), switches and software
scale with the number of accelerators, hosts with the number of nodes: a fat-tree's
switch count grows in proportion to its endpoints, and a software fault can strike any
of the job's processes. A job of n accelerators on h hosts then sees
``sum(rate_gpu-like) * n + rate_host * h`` interruptions per hour, and its mean time
between failures is the inverse, with failures taken to arrive as a Poisson process.
Any rate can be replaced in a scenario (``reliability.failure_rates``).
"""

from __future__ import annotations

from dataclasses import dataclass

from mpsim.specs.reliability import FailureRates

LLAMA3_SOURCE = "Llama 3 paper (arXiv 2407.21783), Table 5: 419 unexpected interruptions in 54 days on 16,384 H100"
LLAMA3_SNAPSHOT_HOURS = 54 * 24
LLAMA3_GPUS = 16_384
LLAMA3_HOSTS = 2_048
LLAMA3_INTERRUPTIONS = {"gpu": 148 + 72 + 19 + 17 + 6 + 6, "host": 32 + 3 + 3 + 2 + 2 + 2 + 2, "nic": 7,
                        "switch": 35, "software": 54 + 7 + 2}

# what each component's count is divided by: accelerators, or hosts
PER_HOST = frozenset({"host"})
COMPONENTS = ("gpu", "host", "nic", "switch", "software")

PUBLISHED_RATES_PER_HOUR = {
    component: count / (LLAMA3_SNAPSHOT_HOURS * (LLAMA3_HOSTS if component in PER_HOST else LLAMA3_GPUS))
    for component, count in LLAMA3_INTERRUPTIONS.items()
}


@dataclass(frozen=True)
class FailureModel:
    """Interruptions per hour of a job, by component, and the mean time between them."""

    per_hour: dict[str, float]  # component -> interruptions per hour of the whole job
    sources: dict[str, str]  # component -> where its rate comes from

    @property
    def total_per_hour(self) -> float:
        return sum(self.per_hour.values())

    @property
    def mtbf_s(self) -> float:
        """Mean seconds between interruptions of the job (infinite without failures)."""
        total = self.total_per_hour
        return 3600.0 / total if total > 0 else float("inf")


def job_failures(devices: int, hosts: int, overrides: FailureRates | None = None) -> FailureModel:
    """The failure model of a job on ``devices`` accelerators in ``hosts`` nodes."""
    per_hour, sources = {}, {}
    for component in COMPONENTS:
        given = getattr(overrides, component) if overrides is not None else None
        rate = PUBLISHED_RATES_PER_HOUR[component] if given is None else given
        per_hour[component] = rate * (hosts if component in PER_HOST else devices)
        sources[component] = LLAMA3_SOURCE if given is None else "scenario (reliability.failure_rates)"
    return FailureModel(per_hour, sources)
