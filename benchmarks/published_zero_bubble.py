"""The Zero Bubble paper's tables for ``benchmarks/validate_published.py``.

Qi et al. 2024, "Zero Bubble Pipeline Parallelism" (ICLR 2024; the extended PDF in the
authors' repository at commit 4769e08) measured its schedules with its own fork of
Megatron-LM on A100 SXM 80GB nodes. Its four model setups (Table 3: 1.5B, 6.2B, 14.6B and
28.3B parameters, sequence 1,024, TP 1) run in every table; the rows differ in the
schedule, the pipeline size, the microbatch size and count. Seven tables have rows:

* Table 4: samples/s per GPU (and peak memory) of 1F1B, interleaved 1F1B, ZB-1p and ZB-2p
  on the Table 3 setups. 48 rows.
* Table 6: ZB-V against ZB-2p (at half the microbatch and twice the count, the same batch),
  ZB-1p and 1F1B, on 16, 24 and 32 GPUs. 36 rows.
* Table 7: ZB-V, ZB-1p and 1F1B at one microbatch size and at twice it, the same count. 18 rows.
* Table 9: the fork's profiled F, B and W pass times of one stage per microbatch. 12 rows.
* Table 10: ZB-2p with the optimizer's post-validation and with the usual synchronised
  optimizer step (the all-reduce of the global norm and the NaN check). 8 rows.
* Table 11: at the same memory: 1F1B and ZB-1p at twice ZB-2p's microbatch. 36 rows, 6 of
  them left out (their microbatch count is printed ambiguously; ``TABLE11_AMBIGUOUS``).
* Table 12: fewer microbatches than pipeline stages, 1F1B against ZB-2p. 18 rows.

Every row is predicted from the model and the layout (the profiled pass times of Table 9
are never used as inputs). Tables 6, 7 and 10-12 print the model by its size only: the
layer count, heads and widths are Table 3's for that size (a 6.2B model is 6.2B
parameters only with Table 3's 30 layers; each setup's layer count is a multiple of the
pipeline size less two, for 16 and 24 stages as for 8 and 32, which the fork's padding
expects), and TP and DP are 1, as in every Table 3 setup.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from published_common import (SCENARIOS, Case, Prediction, middle_stage, number, read_csv, simulate_step,
                              step_breakdown)

MAIN_CSV = "zero_bubble_main_tables3_4_5_9.csv"
MORE_CSV = "zero_bubble_tables6_7_10_11_12.csv"

# The authors' fork of Megatron-LM (github.com/sail-sg/zero-bubble-pipeline-parallelism at the
# paper's commit 4769e08): its examples/pretrain_zero_bubble.sh and the defaults of its
# megatron/arguments.py. Model shapes (layers, heads, hidden, FFN, sequence), TP, PP, DP,
# microbatch and microbatch count come from the CSV (the paper's Table 3).
ZB_BASE = SCENARIOS / "published" / "zero_bubble_a100.yaml"
ZB_MODEL = {
    "ffn_type": "gelu",  # Megatron GPT's MLP (GeLU)
    "norm": "layernorm",  # Megatron GPT's LayerNorm
    "position_embedding": "learned",  # --position-embedding-type default learned_absolute
    "tied_embeddings": True,  # --untie-embeddings-and-output-weights not passed
    "linear_bias": True,  # --disable-bias-linear not passed
    "dropout": 0.1,  # --attention-dropout and --hidden-dropout default 0.1
    # Not printed. The script's GPTSentencePieceTokenizer uses a tokenizer.model from the
    # authors' sample dataset; the Table 3 model sizes (rounded to 0.1B) put vocabulary +
    # positions between about 26K and 34K tokens: 32,000, the LLaMA SentencePiece vocabulary
    "vocab_size": 32000,
}
ZB_ASSUMPTIONS = ("vocabulary 32,000 (not printed; consistent with the Table 3 model sizes)",
                  "fp16 (the fork's example script passes --fp16), unfused attention (no --use-flash-attn)")
ZB_FRAMEWORK = [
    "training.transformer_impl=local",  # the fork's legacy megatron/model (--transformer-impl local)
    "training.dtype=fp16",  # examples/pretrain_zero_bubble.sh: --fp16 unless FP32 is set
    "training.attention=unfused",  # the script passes no --use-flash-attn: Megatron's unfused core attention
    "parallel.recompute=none",  # no --recompute-* flags
    "parallel.sequence_parallel=false",  # TP 1 in every setup
    "training.distributed_optimizer=false",  # no --use-distributed-optimizer (and DP 1)
    "training.overlap_grad_reduce=false",  # --overlap-grad-reduce defaults to off (and DP 1)
    # --fp16 without --accumulate-allreduce-grads-in-fp32 (only --bf16 forces it): the
    # gradients are accumulated in fp16; the optimizer keeps fp32 master weights
    "training.fp32_grad_accumulation=false",
    "training.tp_comm_overlap_backward=true",  # Megatron's default (no TP here)
    "training.pp_scatter_gather=true",  # Megatron's default (no TP here)
]
# paper's name -> (mpsim schedule, chunks per rank: None = one layer per chunk as the paper's
# 1F1B-I runs (--num-layers-per-virtual-pipeline-stage 1), training.pp_send_blocking, whether the
# host synchronizes after each batched p2p)
ZB_SCHEDULES = {
    # Megatron's non-interleaved 1F1B waits for its batched isend/irecv (p2p_communication),
    # then calls torch.cuda.synchronize() (batch_p2p_sync; the fork's arguments.py turns
    # overlap_p2p_comm off for non-interleaved schedules, so batch_p2p_comm is on)
    "1F1B": ("1f1b", 1, "true", True),
    # the fork's Megatron overlaps the interleaved schedule's p2p (--no-overlap-p2p-communication
    # not passed: overlap_p2p_comm defaults to true): a forward's send is waited for before the
    # next forward, a backward's before the next backward (fwd_wait_handles, bwd_wait_handles in
    # schedules.py), the action between them hiding it
    "1F1B-I": ("interleaved-1f1b", None, "false", False),
    # the fork's zb_schedules.py gathers the sends after a pass and the receive the next pass
    # consumes into one batch_isend_irecv (add_communication flushes when the next compute node
    # consumes a receive) and waits for the whole batch before that pass (schedule_f and
    # schedule_b wait on the batch's requests); a weight-gradient pass receives nothing and waits
    # for nothing, and the sends flushed alone are waited for at the end of the iteration.
    # --zero-bubble-max-pending-backward p (ZB-1p) or 2p (ZB-2p) is what mpsim's zb-1p / zb-2p
    # limit (mpsim/schedules/zb_search.py)
    "ZB-1p": ("zb-1p", 1, "with-receive", False),
    "ZB-2p": ("zb-2p", 1, "with-receive", False),
    # --zero-bubble-v-schedule: two chunks per rank in a V (Section 6 of the paper), the pattern
    # mpsim's zbv runs; its scheduler (ZeroBubbleVPipeScheduler) batches and waits the same way
    "ZB-V": ("zbv", 2, "with-receive", False),
}


def zero_bubble_split(layers: int, pp: int, vpp: int) -> list[int]:
    """Layers per model chunk as the fork's --allow-padding-num-layers builds them.

    The layer count is padded up to a multiple of pp, split evenly over the chunks, and
    the padding taken off the last chunk, then the first, and so on
    (``ParallelTransformer.get_offset`` in megatron/model/transformer.py): with 2 padding
    layers the first and the last chunk hold one layer fewer (Table 3's note).
    """
    remainder = layers % pp
    padded = layers - remainder + pp if remainder else layers
    if padded % (pp * vpp):
        raise ValueError(f"{padded} padded layers do not split over {pp} x {vpp} chunks")
    sizes = [padded // (pp * vpp)] * (pp * vpp)
    for index in range(-1, padded - layers - 1):
        sizes[index] -= 1
    return sizes


def setups(data: Path) -> dict[str, dict[str, int]]:
    """Table 3's shape of each model size: layers, heads, hidden, FFN, sequence, TP."""
    shapes: dict[str, dict[str, int]] = {}
    for row in read_csv(data / MAIN_CSV):
        shape = {key: number(row[key]) for key in ("layers", "heads", "hidden", "ffn_hidden", "seq_len", "tp")}
        if shapes.setdefault(row["model"], shape) != shape:
            raise ValueError(f"{MAIN_CSV}: model {row['model']} has two shapes")
    return shapes


def zero_bubble_overrides(model: str, shape: dict[str, int], pp: int, dp: int, microbatch: int, count: int,
                          schedule: str, post_validation: bool = False) -> list[str]:
    """The ``--set`` overrides of ``ZB_BASE`` that run ``schedule`` (a key of ``ZB_SCHEDULES``) on
    ``model`` over ``pp`` x ``dp`` GPUs as the fork ran it (``post_validation``: with the fork's
    --enable-optimizer-post-validation)."""
    name, chunks, blocking, host_sync = ZB_SCHEDULES[schedule]
    layers, tp = shape["layers"], shape["tp"]
    gpus = tp * pp * dp
    if gpus % 8:
        raise ValueError(f"{model}: {gpus} GPUs is not a whole number of 8-GPU nodes")
    remainder = layers % pp
    vpp = chunks or (layers - remainder + pp if remainder else layers) // pp
    spec = dict(name=f"zero-bubble-{model}", num_layers=layers, hidden_size=shape["hidden"],
                ffn_hidden_size=shape["ffn_hidden"], num_attention_heads=shape["heads"],
                seq_length=shape["seq_len"], **ZB_MODEL)
    return [
        "model=" + yaml.safe_dump(spec, default_flow_style=True, width=1 << 20).strip(),
        f"cluster.nodes={gpus // 8}",
        f"parallel.tp={tp}", f"parallel.pp={pp}", f"parallel.dp={dp}", f"parallel.vpp={vpp}",
        f"parallel.schedule={name}",
        f"parallel.microbatch_size={microbatch}", f"parallel.global_batch_size={microbatch * count * dp}",
        f"parallel.layers_per_stage={zero_bubble_split(layers, pp, vpp)}",
        f"training.pp_send_blocking={blocking}",
        f"training.host_sync_between_passes={str(host_sync).lower()}",
        f"training.optimizer_post_validation={str(post_validation).lower()}",
        *ZB_FRAMEWORK,
    ]


def zero_bubble_case(table: str, model: str, shape: dict[str, int], pp: int, dp: int, microbatch: int, count: int,
                     schedule: str, measured: float, memory_gb: float | None, quick: bool,
                     shown: str | None = None, synchronised: bool = False) -> Case:
    """One throughput row: ``schedule`` (a key of ``ZB_SCHEDULES``; labelled ``shown``, the
    paper's name, where that differs) on ``model`` over ``pp`` x ``dp`` GPUs; the zero-bubble
    schedules with the optimizer's post-validation unless the row ran ``synchronised``."""
    post_validation = post_validated(schedule) and not synchronised
    overrides = zero_bubble_overrides(model, shape, pp, dp, microbatch, count, schedule, post_validation)
    notes = ("zb-ilp",) if ZB_SCHEDULES[schedule][0] in ("zb-1p", "zb-2p") else ()
    gpus = shape["tp"] * pp * dp

    def predict() -> Prediction:
        summary = simulate_step(ZB_BASE, overrides)
        extra = {"step_s": summary.step_time_s}
        if memory_gb is not None:
            # the table's memory column beside mpsim's peak (GB as the paper prints them, 1e9 bytes:
            # an assumption, the unit is not defined there); not part of the throughput statistics
            extra.update(mem_meas=memory_gb, mem_pred=summary.peak_memory_bytes / 1e9)
        return Prediction(microbatch * count * dp / summary.step_time_s / gpus, step_breakdown(summary), extra)

    label = f"{model} p={pp} b={microbatch} m={count} {shown or schedule}"
    return Case(table, label, measured, predict, notes, quick)


def post_validated(schedule: str) -> bool:
    """Whether the paper ran ``schedule`` (a key of ``ZB_SCHEDULES``) with the optimizer's
    post-validation: every zero-bubble run did, unless the row says otherwise (Table 10); the
    fork allows it with its zero-bubble schedules only (megatron/arguments.py)."""
    return ZB_SCHEDULES[schedule][0] in ("zb-1p", "zb-2p", "zbv")


def zero_bubble_table4(data: Path) -> list[Case]:
    rows = read_csv(data / MAIN_CSV)
    shapes = setups(data)
    # --quick: the smallest setup (fewest GPUs, microbatches and layers), all four schedules
    first = min((number(r["num_gpus"]), number(r["num_microbatches"]), number(r["layers"])) for r in rows)
    cases = []
    for row in rows:
        pp, dp, gpus = number(row["pp"]), number(row["dp"]), number(row["num_gpus"])
        shape = shapes[row["model"]]
        if shape["tp"] * pp * dp != gpus:
            raise ValueError(f"{row['model']}: tp x pp x dp = {shape['tp'] * pp * dp} for {gpus} GPUs")
        count = number(row["num_microbatches"])
        cases.append(zero_bubble_case("zero_bubble_table4", row["model"], shape, pp, dp, number(row["microbatch"]),
                                      count, row["schedule"], float(row["samples_per_s_per_gpu"]),
                                      float(row["memory_gb"]), quick=(gpus, count, shape["layers"]) == first))
    return cases


# Table 11 prints 32 microbatches in two of its setups (14.6B and 28.3B) where the same
# setups run 64 and 128 microbatches in Tables 4 and 6 and the rows beside them sit in
# that order (48, 32, 128 and 96, 32, 256): a misprint for 64 and 128 most likely, but
# the paper does not say which, so these rows are left out rather than guessed.
TABLE11_AMBIGUOUS = "32 (printed;"
ZB_T11_LEFT_OUT = ("6 rows", ("left out: 14.6B and 28.3B at a microbatch count printed as 32, where the setups run "
                              "64 and 128 elsewhere and the rows beside them are in that order; a misprint most "
                              "likely, but which count ran is not printed"))
# the model of the rows that print it by its size only
ZB_MORE_ASSUMPTIONS = (("the model of each size as in Table 3 (layers, heads, widths; not reprinted), TP 1 and DP 1 "
                        "(the GPU count is the pipeline's)"),)


def more_rows(data: Path, table_ref: str) -> list[dict[str, str]]:
    """The rows of one of Tables 6, 7, 10, 11 and 12 (``table_ref``: "Table 6", ...), as printed."""
    return [row for row in read_csv(data / MORE_CSV) if row["table_ref"] == table_ref]


def _more_table(table: str, table_ref: str, quick_model: str):
    """Builder of one of Tables 6, 7, 10, 11 and 12: every row of ``table_ref`` but the
    ambiguous ones, quick on ``quick_model``'s rows with the fewest microbatches."""

    def build(data: Path) -> list[Case]:
        shapes = setups(data)
        rows = [row for row in more_rows(data, table_ref) if TABLE11_AMBIGUOUS not in row["num_microbatches"]]
        fewest = min(number(r["num_microbatches"]) for r in rows if r["model"] == quick_model)
        cases = []
        for row in rows:
            schedule, _, variant = row["schedule"].partition(" ")
            schedule = schedule.rstrip("*")  # ZB-2p*: ZB-2p at half the microbatch, twice the count
            memory = float(row["memory_gb"]) if row["memory_gb"].strip() else None
            count = number(row["num_microbatches"])
            quick = row["model"] == quick_model and (count == fewest or table_ref == "Table 12")
            # Table 10: "post-validation" or "all-reduce sync" (the optimizer step waits for the
            # global-norm and NaN-check all-reduce)
            cases.append(zero_bubble_case(table, row["model"], shapes[row["model"]], number(row["num_gpus_pp"]), 1,
                                          number(row["microbatch"]), count, schedule,
                                          float(row["samples_per_s_per_gpu"]), memory, quick, shown=row["schedule"],
                                          synchronised=variant == "all-reduce sync"))
        return cases

    return build


zero_bubble_table6 = _more_table("zero_bubble_table6", "Table 6", "6.2B")
zero_bubble_table7 = _more_table("zero_bubble_table7", "Table 7", "6.2B")
zero_bubble_table10 = _more_table("zero_bubble_table10", "Table 10", "1.5B")
zero_bubble_table11 = _more_table("zero_bubble_table11", "Table 11", "1.5B")
zero_bubble_table12 = _more_table("zero_bubble_table12", "Table 12", "1.5B")


# Table 9 of the same paper: the fork's profiled time of one pipeline stage's forward (T_F),
# input-gradient backward (T_B) and weight-gradient backward (T_W) per microbatch, the inputs
# of its Table 5 bubble rates. The fork times each pass with Megatron's Timer, which calls
# torch.cuda.synchronize() and time.time() at its start and stop (megatron/timers.py), in
# iterations 100-110, on every rank, and takes the median over the ranks
# (megatron/core/pipeline_parallel/zb_schedules.py, ScheduleTimers and update_schedule): a
# pass starts on an idle GPU and ends when its last kernel has, so host time the GPU waits
# for is inside it. The median rank is a middle stage (the padded split gives the first and
# last stage one layer fewer). The unit is not printed; milliseconds match Table 4 (1.5B,
# 1F1B, m=24: 24 x (T_F + T_B + T_W) = 1.10 s of a 1.53 s measured step).
ZB_T9_ASSUMPTIONS = ("milliseconds (the unit is not printed; consistent with Table 4's throughput)",
                     ("a middle stage: the most layers, no embedding, no LM head (the fork reports the median "
                      "over the stages)"),
                     ("each pass timed between two torch.cuda.synchronize() calls: host time the GPU waits for "
                      "is inside the measurement; mpsim prices the GPU's kernels"))


def price_stage_passes(overrides: list[str], layers: int) -> Prediction:
    """F, B (input gradient) and W (weight gradient) of one middle stage, in ms."""
    work, model = middle_stage(ZB_BASE, overrides, layers)
    ms = 1e3
    forward, backward, weight = (model.price(p).duration_s * ms
                                 for p in (work.forward, work.backward_input, work.backward_weight))
    total = forward + backward + weight
    return Prediction(total, {"compute": total}, {"f_pred": forward, "b_pred": backward, "w_pred": weight})


def zero_bubble_table9(data: Path) -> list[Case]:
    rows = [r for r in read_csv(data / MAIN_CSV) if r["schedule"] == "1F1B"]
    # --quick: each model once (its fewest microbatches; the passes do not depend on the count)
    fewest = {}
    for row in rows:
        fewest[row["model"]] = min(fewest.get(row["model"], 1 << 30), number(row["num_microbatches"]))
    shapes = setups(data)
    cases = []
    for row in rows:
        pp, microbatch, count = number(row["pp"]), number(row["microbatch"]), number(row["num_microbatches"])
        split = zero_bubble_split(shapes[row["model"]]["layers"], pp, 1)
        # 1F1B's settings: each pass starts after a torch.cuda.synchronize(), as the pass timers
        # (and the batched p2p) make it; the blocking sends do not enter a pass's price
        overrides = zero_bubble_overrides(row["model"], shapes[row["model"]], pp, 1, microbatch, count, "1F1B")
        measured = {key: float(row[column]) for key, column in (("f_meas", "TF"), ("b_meas", "TB"), ("w_meas", "TW"))}

        def predict(overrides=overrides, layers=max(split), measured=measured) -> Prediction:
            prediction = price_stage_passes(overrides, layers)
            prediction.extra.update(measured)
            return prediction

        cases.append(Case("zero_bubble_table9", f"{row['model']} p={pp} m={count} ({max(split)} layers)",
                          sum(measured.values()), predict, quick=count == fewest[row["model"]]))
    return cases
