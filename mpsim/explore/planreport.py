"""Ranking the layouts of a plan and saying why each loser lost.

The winners are the simulated layouts that fit, fastest step first (ties: less memory,
then enumeration order). Every other layout gets one reason, compared with #1:

* ``out of memory``: the memory check failed (the example says by how much, and what
  takes most of it);
* ``bubble``, ``communication``, ``compute``, ``optimizer``: simulated and slower; the
  reason is the part of the step-time breakdown that grew most against #1 (bubble:
  idle time waiting on other stages; communication: exposed TP, PP and DP; compute:
  work on the compute stream, where recompute and less efficient GEMMs show);
* the same four for layouts the bound cut before simulation, judged on the parts of
  their bound (the pipeline fill before their busiest rank can start and the drain after
  its last backward count as bubble),
  which alone already exceeds the step time of the last shown layout;
* ``more recompute than needed``: less recompute fits and is never slower;
* ``invalid``: a combination the framework refuses (the most common reason is shown).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from mpsim.explore.planner import PlanResult, layout_label
from mpsim.explore.tables import fmt_bytes, fmt_count, fmt_percent, fmt_rate, fmt_seconds, render_table
from mpsim.results.memory import LEAST_MEASURED_FRAGMENTATION, TIGHT_FIT_ADVICE, tight_fit
from mpsim.results.throughput import rate_heading, record_rate, throughput_unit
from mpsim.schedules.zb_search import SEARCHED

REASON_ORDER = ("out of memory", "bubble", "communication", "compute", "optimizer", "more recompute than needed",
                "invalid", "failed", "not reached")


def ranked(result: PlanResult) -> list[dict]:
    """Simulated layouts that fit, best first."""
    order = {id(r): i for i, r in enumerate(result.records)}
    fitting = [r for r in result.records if r is not None and r["status"] == "ok"
               and not r["metrics"].get("out_of_memory")]
    return sorted(fitting, key=lambda r: (r["metrics"]["step_time_s"], r["metrics"]["peak_memory_bytes"],
                                          order[id(r)]))


def _comm(m: dict) -> float:
    return m["exposed_tp_comm_s"] + m["exposed_pp_comm_s"] + m["exposed_dp_comm_s"]


def _bound_parts(m: dict) -> dict[str, float]:
    """The bound split like the breakdown: the pipeline fill before the rank starts and the drain after
    its work, its own work, its exposed TP communication and DP reductions, its optimizer."""
    return {"bubble": m.get("bound_head_s", 0.0) + m.get("bound_tail_s", 0.0),
            "compute": m["bound_busy_s"] - m["bound_tp_exposed_s"],
            "communication": m["bound_tp_exposed_s"] + m.get("bound_dp_s", 0.0), "optimizer": m["bound_optimizer_s"]}


def loss_reason(record: dict, best: dict) -> tuple[str, str]:
    """(reason, detail) of one layout that did not make the top, against the best one."""
    status, m, b = record["status"], record.get("metrics") or {}, best["metrics"]
    if status == "oom" or (status == "ok" and m.get("out_of_memory")):
        return "out of memory", record.get("error") or f"needs {fmt_bytes(m.get('peak_memory_bytes'))}"
    if status == "dominated":
        return "more recompute than needed", record.get("error") or ""
    if status == "invalid":
        return "invalid", record.get("error") or ""
    if status == "error":
        return "failed", record.get("error") or ""
    if status == "ok":
        deltas = {"compute": m["compute_s"] - b["compute_s"], "bubble": m["bubble_s"] - b["bubble_s"],
                  "communication": _comm(m) - _comm(b), "optimizer": m["optimizer_s"] - b["optimizer_s"]}
        reason = max(deltas, key=deltas.__getitem__)
        mine, theirs = {"compute": (m["compute_s"], b["compute_s"]), "bubble": (m["bubble_s"], b["bubble_s"]),
                        "communication": (_comm(m), _comm(b)),
                        "optimizer": (m["optimizer_s"], b["optimizer_s"])}[reason]
        # the bubble of the breakdown is the idle time less the waits for pipeline transfers
        # (those count as communication), so it can be below the idle time the summary prints
        part = "bubble (idle, transfer waits apart)" if reason == "bubble" else reason
        return reason, (f"step {fmt_seconds(m['step_time_s'])}: {part} {fmt_seconds(mine)} "
                        f"vs {fmt_seconds(theirs)} in #1")
    if status == "bound" and "bound_busy_s" in m and "bound_busy_s" in b:
        mine, theirs = _bound_parts(m), _bound_parts(b)
        reason = max(mine, key=lambda k: mine[k] - theirs[k])
        part = "pipeline fill and drain" if reason == "bubble" else reason
        return reason, (f"not simulated: its fill and drain plus its busiest rank's own work and reductions, "
                        f"{fmt_seconds(m['lower_bound_s'])}, "
                        f"already exceeds the last shown step time (in the lower bounds: {part} "
                        f"{fmt_seconds(mine[reason])} vs {fmt_seconds(theirs[reason])} in #1's)")
    return "not reached", record.get("error") or status


@dataclass
class Loss:
    """One reason: how many layouts lost for it and the best-placed example."""

    reason: str
    count: int
    example: dict
    detail: str


def explain_losses(result: PlanResult, shown: int) -> list[Loss]:
    """Reasons for every layout outside the first ``shown``, most common first within the fixed order."""
    winners = ranked(result)
    if not winners:
        return []
    best, top_ids = winners[0], {id(r) for r in winners[:shown]}
    position = {id(r): i for i, r in enumerate(winners)}
    groups: dict[str, list[tuple[Any, dict, str]]] = {}
    for index, record in enumerate(result.records):
        if record is None or id(record) in top_ids:
            continue
        reason, detail = loss_reason(record, best)
        # the example is the closest miss: simulated ones by rank, cut ones by their bound,
        # out-of-memory ones by how little they need, the rest in enumeration order
        metrics = record.get("metrics") or {}
        closeness = {"ok": position.get(id(record), len(winners)), "bound": metrics.get("lower_bound_s", 0.0),
                     "oom": metrics.get("peak_memory_bytes", 0.0)}.get(record["status"], 0.0)
        sort_key = (closeness, index)
        groups.setdefault(reason, []).append((sort_key, record, detail))
    losses = []
    for reason in REASON_ORDER:
        members = groups.get(reason)
        if not members:
            continue
        _, example, detail = min(members, key=lambda item: item[0])
        if reason == "invalid":
            # the example is one of the layouts the most common reason refused
            common, count = Counter(d for _, _, d in members).most_common(1)[0]
            _, example, _ = min((item for item in members if item[2] == common), key=lambda item: item[0])
            detail = f"most common ({count:,}): {common}"
        losses.append(Loss(reason, len(members), example, detail))
    return losses


def status_counts(result: PlanResult) -> Counter:
    return Counter(r["status"] for r in result.records if r is not None)


def top_table(rows: list[dict], first_position: int = 1) -> str:
    """The winners as a table (cp and ep columns only when some layout uses them, etp when some
    layout folds its experts over fewer ranks than tp)."""
    extra = [name for name in ("cp", "ep") if any(r["point"].get(f"parallel.{name}", 1) != 1 for r in rows)]
    if any(r["point"].get("parallel.etp") not in (None, r["point"].get("parallel.tp", r["metrics"]["tp"]))
           for r in rows):
        extra.append("etp")
    body = []
    for i, record in enumerate(rows, start=first_position):
        p, m = record["point"], record["metrics"]
        tp = p.get("parallel.tp", m["tp"])
        body.append([f"#{i}", tp] + [p.get(f"parallel.{name}") or (tp if name == "etp" else 1) for name in extra]
                    + [p.get("parallel.pp", m["pp"]), m["dp"], m["vpp"], m["microbatch_size"], m["schedule"],
                       "on" if p.get("parallel.sequence_parallel") else "off", p.get("parallel.zero_stage", 0),
                       p.get("parallel.recompute", "-"), fmt_seconds(m["step_time_s"]), fmt_rate(record_rate(m)[0]),
                       fmt_percent(m["mfu"]), fmt_percent(m["bubble_fraction"]), fmt_bytes(m["peak_memory_bytes"])])
    rate = rate_heading(record_rate(record["metrics"])[1] for record in rows)
    return render_table(["rank", "tp"] + extra + ["pp", "dp", "vpp", "mbs", "schedule", "sp", "zero", "recompute",
                                                  "step", rate, "MFU", "bubble", "peak memory"], body)


def _sample_text(model) -> str:
    """What one sample of the batch is: a sequence of so many tokens, or the unit throughput is counted in."""
    unit = throughput_unit(model)
    return f"sequence {model.seq_length:,}" if unit.name == "tokens" else f"throughput in {unit.rate_name()}"


def format_plan(result: PlanResult, shown: int) -> str:
    """The plan as printed by ``mpsim plan``: counts, the best layouts, why the others lost."""
    scenario = result.scenario
    counts = status_counts(result)
    total = len(result.points)
    system, model = scenario.cluster.system, scenario.model
    lines = [f"plan: {model.name} on {scenario.cluster.devices:,} x {system.accelerator.name} ({system.name}), "
             f"{_sample_text(model)}, global batch {scenario.parallel.global_batch_size:,}"]
    rate = total / result.elapsed_s if result.elapsed_s > 0 else float("inf")
    lines.append(f"{fmt_count(total)} layouts: {fmt_count(counts['invalid'])} invalid, "
                 f"{fmt_count(counts['oom'])} out of memory, {fmt_count(counts['dominated'])} with more recompute "
                 f"than needed, {fmt_count(counts['ok'] + counts['bound'] + counts['fits'] + counts['error'])} "
                 f"checked further: {fmt_count(counts['ok'])} simulated, {fmt_count(counts['bound'])} cut by the "
                 f"step-time bound" + (f", {fmt_count(counts['error'])} failed" if counts["error"] else ""))
    lines.append(f"({result.elapsed_s:.1f} s, {rate:,.0f} layouts/s on {result.workers} "
                 f"{result.backend} worker{'s' if result.workers != 1 else ''}"
                 + (f"; {fmt_count(result.reused)} records reused from the results file" if result.reused else "")
                 + ")")
    winners = ranked(result)
    if not winners:
        if counts["oom"] or counts["ok"]:  # where nothing could run at all, the error line after this says why
            lines.append("\nno layout fits in memory; try more devices, a larger --set parallel.global_batch_size "
                         "split, or a smaller model")
        losses = explain_losses(result, 0)
    else:
        lines += ["", f"best {min(shown, len(winners))} layouts", top_table(winners[:shown])]
        tight = [f"#{i}" for i, record in enumerate(winners[:shown], start=1)
                 if tight_fit(record["metrics"]["peak_memory_bytes"], record["metrics"]["capacity_bytes"],
                              scenario.training.memory_fragmentation)]
        if tight:
            verb, whose = ("leaves", "its") if len(tight) == 1 else ("leave", "their")
            lines.append(f"note: {', '.join(tight)} {verb} less than {100 * LEAST_MEASURED_FRAGMENTATION:.1f} % of "
                         f"{whose} peak free; {TIGHT_FIT_ADVICE}")
        searched = sorted({record["metrics"]["schedule"] for record in winners[:shown]} & set(SEARCHED))
        if searched:
            verb = "is" if len(searched) == 1 else "are"
            lines.append(f"note: {' and '.join(searched)} {verb} priced here in the order searched for unit pass times; "
                         f"mpsim run searches again with the layout's own times and memory and may report another "
                         f"step and peak (docs/schedules.md)")
        losses = explain_losses(result, shown)
    if losses:
        body = [[loss.reason, fmt_count(loss.count), layout_label(loss.example["point"]), loss.detail]
                for loss in losses]
        lines += ["", "why the others lost (against #1)", render_table(["reason", "layouts", "example", "detail"],
                                                                       body)]
    return "\n".join(lines)


def matching(result: PlanResult, wanted: dict[str, Any]) -> list[tuple[str, dict]]:
    """Where layouts matching ``wanted`` (short names: tp, pp, dp, vpp, mbs, schedule, ...) ended up."""
    winners = ranked(result)
    position = {id(r): i + 1 for i, r in enumerate(winners)}
    best = winners[0] if winners else None
    found = []
    for record in result.records:
        if record is None:
            continue
        short = short_fields(record, result.scenario.cluster.devices)
        if all(str(short.get(k)) == str(v) for k, v in wanted.items()):
            if id(record) in position:
                where = f"#{position[id(record)]} of {len(winners)}"
            elif best is not None:
                reason, detail = loss_reason(record, best)
                where = f"{reason}: {detail}"
            else:
                where = record["status"]
            found.append((where, record))
    found.sort(key=lambda item: (0, int(item[0][1:].split()[0])) if item[0].startswith("#") else (1, 0))
    return found


# the short names a layout answers to (``short_fields``; ``mpsim plan --find`` takes them)
SHORT_NAMES = ("tp", "cp", "pp", "dp", "ep", "etp", "vpp", "mbs", "schedule", "sp", "zero", "recompute")


def short_fields(record: dict, devices: int) -> dict[str, Any]:
    """A record's layout under short names (:data:`SHORT_NAMES`)."""
    out = {name.rsplit(".", 1)[-1]: value for name, value in record["point"].items()}
    out["mbs"] = out.pop("microbatch_size", None)
    out["sp"] = out.pop("sequence_parallel", None)
    out["zero"] = out.pop("zero_stage", None)
    out.pop("layers_per_stage", None)
    if "tp" in out and "pp" in out:
        out["dp"] = devices // (out["tp"] * out.get("cp", 1) * out["pp"])
    return out
