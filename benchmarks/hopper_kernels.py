"""On an NVIDIA GPU: the GEMM and attention kernels of the dgxc rows, timed cold and after a minute of load.

mpsim prices a layer's GEMMs from the accelerator file's best-measured matmul throughput
(``efficiency.gemm``), the tile model and the memory bandwidth, and its fused attention
from a published sweep. This script measures the same kernels on the GPU at hand, so the
pricing can be checked shape by shape against a measurement nobody tuned for, and so the
clock the GPU holds under a minute of back-to-back work can be read next to the clock of
a short benchmark (``nvidia-smi``'s SM clock and power through NVML, sampled every 0.2 s).

What it times, with CUDA events around each call, on random data, rotating over input sets
larger than the L2 cache, median of the calls:

1. every GEMM the harness's dgxc layers run (forward, input gradient, weight gradient, with
   the transposes autograd uses), plus 8192^3 (the MAMF reference shape): once right
   after a pause ("cold") and once after a minute of back-to-back GEMMs ("loaded"); and a
   few of them as ten-call bursts, each after its own pause ("burst": how a short
   benchmark such as a MAMF sweep finds the GPU);
2. causal attention forward and backward at head dim 128 through torch's SDPA, with each
   backend torch offers here (FlashAttention-2, cuDNN), at 4k and 8k tokens;
3. fp8 GEMMs as Transformer Engine runs them (E4M3, K-major operands, bf16 output) for the
   70B FP8 rows' layer and the 8B's MLP, as bursts and loaded (``fp8``);
4. a Llama 3.1 8B layer (hidden 4096, FFN 14336 SwiGLU, GQA 32/8, RMSNorm, RoPE) forward
   and backward at 4k and 8k tokens in eager PyTorch, loaded.

Writes ``OUT/hopper_kernels.json`` (every timing and clock sample) and prints one line
per kernel. ``benchmarks/gemm_sweep.py`` and ``benchmarks/hopper_layer.py`` read the
JSON from ``benchmarks/data/``.

Usage: ``python benchmarks/hopper_kernels.py --out DIR [--heat-s 60]``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

SEED = 1234
CALLS, WARMUP = 30, 5

# (label, tokens M, out features N, in features K): the linear layers of the dgxc recipes'
# layers on one rank, as mpsim's workload builds them
LINEARS = [
    ("llama8b.qkv", 4096, 6144, 4096), ("llama8b.proj", 4096, 4096, 4096),
    ("llama8b.fc1", 4096, 28672, 4096), ("llama8b.fc2", 4096, 4096, 14336),
    ("llama70b-tp4.qkv", 8192, 2560, 8192), ("llama70b-tp4.proj", 8192, 8192, 2048),
    ("llama70b-tp4.fc1", 8192, 14336, 8192), ("llama70b-tp4.fc2", 8192, 8192, 7168),
    ("nemotron15b-tp2.qkv", 4096, 4096, 6144), ("nemotron15b-tp2.proj", 4096, 6144, 3072),
    ("nemotron15b-tp2.fc1", 4096, 12288, 6144), ("nemotron15b-tp2.fc2", 4096, 6144, 12288),
]
SQUARE = ("square", 8192, 8192, 8192)


class Sampler:
    """NVML readings (SM clock MHz, power W, temperature C) every ``period_s`` in a thread."""

    def __init__(self, period_s: float = 0.2):
        import pynvml

        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.period_s = period_s
        self.samples: list[dict] = []
        self.phase = "idle"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        nvml, handle = self.nvml, self.handle
        start = time.monotonic()
        while not self._stop.is_set():
            try:
                self.samples.append({
                    "t_s": round(time.monotonic() - start, 3), "phase": self.phase,
                    "sm_mhz": nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
                    "mem_mhz": nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM),
                    "power_w": nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
                    "temp_c": nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU),
                })
            except Exception as exc:  # noqa: BLE001 - a reading that fails is recorded, not fatal
                self.samples.append({"phase": self.phase, "error": str(exc)})
            time.sleep(self.period_s)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def static(self) -> dict:
        nvml, handle = self.nvml, self.handle
        info = {}
        for name, call in (("power_limit_w", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0),
                           ("max_sm_mhz", lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM)),
                           ("max_mem_mhz", lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_MEM))):
            try:
                info[name] = call()
            except Exception as exc:  # noqa: BLE001
                info[name] = f"unreadable: {exc}"
        return info


def timed(torch, run, inputs: list, calls: int = CALLS, warmup: int = WARMUP) -> float:
    """Median seconds of ``run(*inputs[i % len])`` over ``calls`` calls, each between CUDA events."""
    for i in range(warmup):
        run(*inputs[i % len(inputs)])
    pairs = []
    for i in range(calls):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run(*inputs[i % len(inputs)])
        end.record()
        pairs.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in pairs) / 1e3


def gemm_sets(torch, m: int, n: int, k: int, sets: int) -> dict[str, list]:
    """Operands of a linear layer's three GEMMs: y = x W^T, dx = dy W, dW = dy^T x."""
    def rand(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
    xs = [(rand(m, k), rand(n, k), rand(m, n)) for _ in range(sets)]
    return {"forward": [(x, w.t()) for x, w, _ in xs], "dgrad": [(dy, w) for _, w, dy in xs],
            "wgrad": [(dy.t(), x) for x, _, dy in xs]}


def gemm_pass(torch, sampler: Sampler, phase: str) -> list[dict]:
    sampler.phase = phase
    rows = []
    for label, m, n, k in [*LINEARS, SQUARE]:
        bytes_per_set = 2 * (m * k + n * k + m * n)
        sets = max(2, min(6, int(3 * 60e6 // bytes_per_set) + 1))  # several times the 60 MB L2
        operands = gemm_sets(torch, m, n, k, sets)
        shapes = {"forward": (m, n, k), "dgrad": (m, k, n), "wgrad": (n, k, m)}
        for kind, inputs in operands.items():
            if label == "square" and kind != "forward":
                continue
            seconds = timed(torch, torch.matmul, inputs)
            gm, gn, gk = shapes[kind]
            tflops = 2.0 * gm * gn * gk / seconds / 1e12
            rows.append({"phase": phase, "label": f"{label}.{kind}", "m": gm, "n": gn, "k": gk, "seconds": seconds,
                         "tflops": tflops})
            print(f"  {phase:6s} {label + '.' + kind:28s} M={gm:6d} N={gn:6d} K={gk:6d} {1e3 * seconds:8.3f} ms "
                  f"{tflops:6.1f} TFLOP/s", flush=True)
        del operands
    torch.cuda.empty_cache()
    return rows


BURST_SHAPES = [SQUARE, LINEARS[2], LINEARS[3], LINEARS[4], LINEARS[6], LINEARS[10]]
BURST_CALLS = 10


def burst_pass(torch, sampler: Sampler, pause_s: float) -> list[dict]:
    """Each shape's forward GEMM as a short burst after ``pause_s`` idle: the GPU starts cool and
    below its power limit, as a microbenchmark that times a few calls finds it. The SM clock
    is read right after the burst."""
    rows = []
    nvml, handle = sampler.nvml, sampler.handle
    for label, m, n, k in BURST_SHAPES:
        inputs = gemm_sets(torch, m, n, k, 2)["forward"]
        torch.cuda.synchronize()
        sampler.phase = "pause"
        time.sleep(pause_s)
        sampler.phase = "burst"
        seconds = timed(torch, torch.matmul, inputs, calls=BURST_CALLS, warmup=3)
        clock = nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)
        tflops = 2.0 * m * n * k / seconds / 1e12
        rows.append({"phase": "burst", "label": f"{label}.forward", "m": m, "n": n, "k": k, "seconds": seconds,
                     "tflops": tflops, "sm_mhz_after": clock})
        print(f"  burst  {label + '.forward':28s} M={m:6d} N={n:6d} K={k:6d} {1e3 * seconds:8.3f} ms "
              f"{tflops:6.1f} TFLOP/s, SM clock after {clock} MHz", flush=True)
        del inputs
    torch.cuda.empty_cache()
    return rows


FP8_SHAPES = [SQUARE, *LINEARS[4:8], LINEARS[2], LINEARS[3]]  # the 70B FP8 rows' layer, the 8B's MLP


def fp8_sets(torch, m: int, n: int, k: int, sets: int) -> list[tuple]:
    """Operands of an fp8 GEMM as Transformer Engine runs it on Hopper: E4M3 A[M,K] and
    B[K,N] both K-major (B is a row-major [N,K] weight seen transposed), per-tensor fp32
    scales, a bf16 output."""
    scale = torch.ones((), device="cuda", dtype=torch.float32)
    out = []
    for _ in range(sets):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16).to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).to(torch.float8_e4m3fn).t()
        out.append((a, b, scale, scale))
    return out


def fp8_pass(torch, sampler: Sampler, pause_s: float, heat_s: float) -> list[dict]:
    """Each fp8 shape as a ten-call burst after a pause, then all of them after ``heat_s`` of
    back-to-back fp8 GEMMs (torch._scaled_mm, cuBLASLt's fp8 kernels)."""
    def run(a, b, scale_a, scale_b):
        return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=torch.bfloat16)

    rows = []
    nvml, handle = sampler.nvml, sampler.handle
    for phase in ("fp8-burst", "fp8-loaded"):
        if phase == "fp8-loaded":
            sampler.phase = "fp8-heat"
            _, m, n, k = LINEARS[6]
            inputs = fp8_sets(torch, m, n, k, 2)
            end = time.monotonic() + heat_s
            while time.monotonic() < end:
                for _ in range(50):
                    run(*inputs[0])
                    run(*inputs[1])
                torch.cuda.synchronize()
            del inputs
        for label, m, n, k in FP8_SHAPES:
            inputs = fp8_sets(torch, m, n, k, 2)
            torch.cuda.synchronize()
            if phase == "fp8-burst":
                sampler.phase = "pause"
                time.sleep(pause_s)
            sampler.phase = phase
            try:
                seconds = timed(torch, run, inputs, calls=BURST_CALLS if phase == "fp8-burst" else CALLS, warmup=3)
            except Exception as exc:  # noqa: BLE001 - recorded: this torch or GPU may have no fp8 GEMM
                rows.append({"phase": phase, "label": f"{label}.forward", "error": str(exc).splitlines()[0][:200]})
                print(f"  {phase} {label}: unavailable ({str(exc).splitlines()[0][:80]})", flush=True)
                return rows
            clock = nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)
            tflops = 2.0 * m * n * k / seconds / 1e12
            rows.append({"phase": phase, "label": f"{label}.forward", "m": m, "n": n, "k": k, "seconds": seconds,
                         "tflops": tflops, "sm_mhz_after": clock, "dtype": "fp8"})
            print(f"  {phase:10s} {label + '.forward':28s} M={m:6d} N={n:6d} K={k:6d} {1e3 * seconds:8.3f} ms "
                  f"{tflops:7.1f} TFLOP/s, SM clock {clock} MHz", flush=True)
            del inputs
    torch.cuda.empty_cache()
    return rows


def heat(torch, sampler: Sampler, seconds: float) -> None:
    """Back-to-back GEMMs of the largest layer shape for ``seconds``: the load of a training step."""
    sampler.phase = "heat"
    _, m, n, k = LINEARS[2]
    inputs = gemm_sets(torch, m, n, k, 2)["forward"]
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(50):
            torch.matmul(*inputs[0])
            torch.matmul(*inputs[1])
        torch.cuda.synchronize()
    del inputs
    torch.cuda.empty_cache()


def memory_pass(torch, sampler: Sampler) -> list[dict]:
    """Streaming kernels over 1 GiB buffers, far past the L2: a copy (one read, one write) and an
    add (two reads, one write), as BabelStream's Copy and Add; bytes moved over the median time."""
    sampler.phase = "memory"
    elements = (1 << 30) // 4
    buffers = [torch.rand(elements, device="cuda") for _ in range(3)]
    rows = []
    for label, run, moved in (("copy", lambda: buffers[0].copy_(buffers[1]), 2),
                              ("add", lambda: torch.add(buffers[1], buffers[2], out=buffers[0]), 3)):
        seconds = timed(torch, run, [()], calls=20)
        bandwidth = moved * elements * 4 / seconds
        rows.append({"label": f"memory.{label}", "bytes": moved * elements * 4, "seconds": seconds,
                     "bytes_per_s": bandwidth})
        print(f"  memory {label:4s} {moved} x 1 GiB {1e3 * seconds:7.3f} ms {bandwidth / 1e9:7.1f} GB/s", flush=True)
    buffers.clear()
    torch.cuda.empty_cache()
    return rows


def attention_pass(torch, sampler: Sampler, heat_s: float = 0.0, seqs=(4096, 8192),
                   backends=("flash2", "cudnn")) -> list[dict]:
    """Causal attention forward and backward; with ``heat_s`` each kernel first runs back to back
    that long, so it is timed at the power limit it brings the GPU to itself ("loaded")."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    phase = "attention-loaded" if heat_s else "attention"
    sampler.phase = phase
    rows = []
    heads, kv_heads, head_dim = 32, 8, 128
    backends = {"flash2": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}.items() \
        if backends == ("flash2", "cudnn") else [(name, getattr(SDPBackend, {"flash2": "FLASH_ATTENTION",
                                                                           "cudnn": "CUDNN_ATTENTION"}[name]))
                                                 for name in backends]
    for seq in seqs:
        q = torch.randn(1, heads, seq, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        kv = [torch.randn(1, kv_heads, seq, head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
              for _ in range(2)]
        # GQA as Transformer Engine runs it: K and V repeated to the query heads before the kernel
        k, v = (t.repeat_interleave(heads // kv_heads, dim=1).detach().requires_grad_() for t in kv)
        grad = torch.randn_like(q)
        # causal: half the score matrix (the FLOP convention of the FlashAttention papers)
        flops_fwd = 4.0 * seq * seq * heads * head_dim / 2
        for name, backend in backends:
            try:
                with sdpa_kernel(backend):
                    def forward():
                        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    end = time.monotonic() + heat_s
                    while time.monotonic() < end:
                        for _ in range(10):
                            torch.autograd.grad(forward(), (q, k, v), grad)
                        torch.cuda.synchronize()
                    fwd_s = timed(torch, lambda: forward(), [()])
                    out = forward()

                    def backward():
                        return torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)
                    bwd_s = timed(torch, lambda: backward(), [()])
            except Exception as exc:  # noqa: BLE001 - a backend torch cannot run here is recorded
                rows.append({"label": f"attention.{name}.s{seq}", "error": str(exc).splitlines()[0][:200]})
                print(f"  attention {name} s={seq}: unavailable ({str(exc).splitlines()[0][:80]})", flush=True)
                continue
            rows.append({"label": f"attention.{name}.s{seq}", "phase": phase, "seq": seq, "heads": heads,
                         "head_dim": head_dim, "causal": True, "forward_s": fwd_s, "backward_s": bwd_s,
                         "forward_tflops": flops_fwd / fwd_s / 1e12, "backward_tflops": 2.5 * flops_fwd / bwd_s / 1e12})
            print(f"  {phase} {name:6s} s={seq:5d} fwd {1e3 * fwd_s:7.3f} ms {flops_fwd / fwd_s / 1e12:6.1f} TF, "
                  f"bwd {1e3 * bwd_s:7.3f} ms {2.5 * flops_fwd / bwd_s / 1e12:6.1f} TF", flush=True)
    torch.cuda.empty_cache()
    return rows


def llama_layer_pass(torch, sampler: Sampler) -> list[dict]:
    import torch.nn.functional as F

    sampler.phase = "layer"
    hidden, ffn, heads, kv_heads, head_dim = 4096, 14336, 32, 8, 128
    dt = torch.bfloat16

    def param(*shape):
        return (torch.randn(*shape, device="cuda", dtype=dt) * 0.02).requires_grad_()
    wqkv, wo = param((heads + 2 * kv_heads) * head_dim, hidden), param(hidden, hidden)
    w1, w2 = param(2 * ffn, hidden), param(hidden, ffn)
    n1, n2 = torch.ones(hidden, device="cuda", dtype=dt, requires_grad=True), torch.ones(
        hidden, device="cuda", dtype=dt, requires_grad=True)
    rows = []

    def rope(t, cos, sin):
        half = t.shape[-1] // 2
        rotated = torch.cat((-t[..., half:], t[..., :half]), dim=-1)
        return t * cos + rotated * sin

    def layer(x, cos, sin):
        seq = x.shape[0]
        h = F.rms_norm(x, (hidden,), n1)
        qkv = F.linear(h, wqkv)
        q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
        q = rope(q.view(seq, heads, head_dim).transpose(0, 1), cos, sin)
        k = rope(k.view(seq, kv_heads, head_dim).transpose(0, 1), cos, sin)
        v = v.view(seq, kv_heads, head_dim).transpose(0, 1)
        a = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, enable_gqa=True)
        x = x + F.linear(a[0].transpose(0, 1).reshape(seq, hidden), wo)
        h = F.rms_norm(x, (hidden,), n2)
        gate, up = F.linear(h, w1).chunk(2, dim=-1)
        return x + F.linear(F.silu(gate) * up, w2)

    for seq in (4096, 8192):
        x = torch.randn(seq, hidden, device="cuda", dtype=dt, requires_grad=True)
        angle = torch.arange(seq, device="cuda")[:, None] * (10000 ** (-torch.arange(0, head_dim, 2, device="cuda")
                                                                     / head_dim))[None]
        cos = torch.cat((angle.cos(), angle.cos()), -1).to(dt)[None]
        sin = torch.cat((angle.sin(), angle.sin()), -1).to(dt)[None]
        grad = torch.randn_like(x)
        try:
            fwd_s = timed(torch, lambda: layer(x, cos, sin), [()], calls=20)

            def step():
                torch.autograd.backward(layer(x, cos, sin), grad)
            step_s = timed(torch, step, [()], calls=20)
        except Exception as exc:  # noqa: BLE001
            rows.append({"label": f"llama8b.layer.s{seq}", "error": str(exc).splitlines()[0][:200]})
            print(f"  layer s={seq}: failed ({str(exc).splitlines()[0][:80]})", flush=True)
            continue
        rows.append({"label": f"llama8b.layer.s{seq}", "seq": seq, "forward_s": fwd_s, "forward_backward_s": step_s})
        print(f"  llama 8B layer s={seq}: forward {1e3 * fwd_s:.3f} ms, forward+backward {1e3 * step_s:.3f} ms",
              flush=True)
    torch.cuda.empty_cache()
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="hopper_kernels", help="folder for hopper_kernels.json")
    parser.add_argument("--heat-s", type=float, default=60.0, help="seconds of back-to-back GEMMs before 'loaded'")
    parser.add_argument("--pause-s", type=float, default=10.0, help="idle seconds before the cold pass and each burst")
    parser.add_argument("--phases", default="burst,cold,loaded,attention,layer",
                        help="comma-separated: burst (each of a few shapes after a pause), cold (every GEMM after "
                             "a pause), loaded (every GEMM after --heat-s of load), fp8 (the 70B FP8 layer's "
                             "GEMMs in fp8, bursts and loaded), memory (copy and add over 1 GiB), attention, "
                             "attention-loaded (cuDNN after --heat-s / 2 of itself), layer")
    args = parser.parse_args()
    phases = set(args.phases.split(","))
    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA device is visible; this script times GPU kernels", file=sys.stderr)
        return 2
    torch.manual_seed(SEED)
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True  # PyTorch's default, stated
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                    "cuda": torch.version.cuda, "python": platform.python_version(),
                    "date_utc": time.strftime("%Y-%m-%d", time.gmtime()), "calls": CALLS, "warmup": WARMUP}
    with Sampler() as sampler:
        record.update(sampler.static())
        print(f"{record['device']}: power limit {record['power_limit_w']} W, max SM clock {record['max_sm_mhz']} MHz",
              flush=True)
        record["gemm"] = []
        if "burst" in phases:
            record["gemm"] += burst_pass(torch, sampler, args.pause_s)
        if "cold" in phases:
            time.sleep(args.pause_s)
            record["gemm"] += gemm_pass(torch, sampler, "cold")
        if "loaded" in phases:
            heat(torch, sampler, args.heat_s)
            record["gemm"] += gemm_pass(torch, sampler, "loaded")
        if "fp8" in phases:
            record["fp8"] = fp8_pass(torch, sampler, args.pause_s, args.heat_s)
        if "memory" in phases:
            record["memory"] = memory_pass(torch, sampler)
        if "attention" in phases:
            record["attention"] = attention_pass(torch, sampler)
        if "attention-loaded" in phases:
            record["attention_loaded"] = attention_pass(torch, sampler, args.heat_s / 2, seqs=(4096, 8192),
                                                        backends=("cudnn",))
        if "layer" in phases:
            record["layer"] = llama_layer_pass(torch, sampler)
        sampler.phase = "done"
    record["samples"] = sampler.samples
    (out / "hopper_kernels.json").write_text(json.dumps(record, indent=1))
    for phase in ("burst", "cold", "heat", "loaded", "fp8-burst", "fp8-heat", "fp8-loaded", "memory", "attention",
                  "attention-loaded", "layer"):
        clocks = [s["sm_mhz"] for s in sampler.samples if s.get("phase") == phase and "sm_mhz" in s]
        power = [s["power_w"] for s in sampler.samples if s.get("phase") == phase and "power_w" in s]
        if clocks:
            print(f"{phase:9s} SM clock median {statistics.median(clocks):.0f} MHz (min {min(clocks)}, max "
                  f"{max(clocks)}), power median {statistics.median(power):.0f} W, {len(clocks)} samples")
    return 0


if __name__ == "__main__":
    sys.exit(main())
