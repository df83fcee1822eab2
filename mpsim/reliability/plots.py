"""Pictures of a step-time distribution (histogram with percentiles) and of a run's time (stacked bar)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from mpsim.reliability.goodput import SECONDS_PER_DAY, GoodputReport  # noqa: E402
from mpsim.reliability.report import StepDistribution  # noqa: E402


def plot_distribution(d: StepDistribution, path: str) -> None:
    """Histograms of one replica's and the job's step times, with mean, p50, p90 and p99 marked."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.hist(d.replica_step_time_s, bins=40, density=True, alpha=0.55, color="tab:blue", label="one replica")
    ax.hist(d.job_step_time_s, bins=60, density=True, alpha=0.55, color="tab:orange",
            label=f"job: slowest of {d.replicas}")
    # the two sets of labels at different heights, so that close percentiles stay readable
    for p, color, height in ((d.replica, "tab:blue", 0.98), (d.job, "tab:orange", 0.78)):
        for name, value, style in (("p50", p.p50_s, "-"), ("p90", p.p90_s, "--"), ("p99", p.p99_s, ":")):
            ax.axvline(value, color=color, linestyle=style, linewidth=1.2)
            ax.annotate(name, (value, height), xycoords=("data", "axes fraction"), color=color, fontsize=8,
                        ha="left", va="top", rotation=90)
    ax.set_xlabel("step time (s)")
    ax.set_ylabel("density")
    ax.set_title(f"step-time distribution ({d.samples} samples, seed {d.seed})")
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_goodput(g: GoodputReport, path: str) -> None:
    """The run's expected wall-clock days as a stacked bar (training, checkpoint writes, lost work,
    restarts), and beside it the lost time alone, which is too thin to read on the first bar."""
    run = g.run
    lost_parts = (("checkpoint writes", run.checkpoint_s, "tab:blue"), ("lost work", run.lost_work_s, "tab:red"),
                  ("restarts", run.restart_s, "tab:gray"))
    fig, (whole, lost) = plt.subplots(1, 2, figsize=(8, 4.5))
    for ax, parts in ((whole, (("training", run.training_s, "tab:green"),) + lost_parts), (lost, lost_parts)):
        bottom = 0.0
        for label, seconds, color in parts:
            days = seconds / SECONDS_PER_DAY
            ax.bar([0], [days], bottom=bottom, color=color, width=0.5, label=f"{label}: {days:.2f} d")
            bottom += days
        ax.set_xlim(-0.6, 0.6)
        ax.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), fontsize=8, frameon=False)
    whole.set_xticks([0], [f"whole run: {g.days:.1f} d"])
    lost.set_xticks([0], ["lost time only"])
    whole.set_ylabel("expected wall-clock days")
    fig.suptitle(f"{g.tokens:.3g} tokens: effective training time {run.effective_fraction:.1%}", y=0.99)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
