"""Reading PyTorch profiler (Kineto) traces: linking, categories, shapes, collectives, summaries.

The expected values below were read from the raw JSON of the extracts in tests/data/traces
(README.md there says where they come from), not from the reader: a kernel's
``args.correlation`` looked up among the ``cuda_runtime`` events, and the ``cpu_op`` and
``user_annotation`` events on the runtime call's pid/tid whose ``[ts, ts + dur]`` contains
the call's ``ts``.
"""

from __future__ import annotations

import gzip
import itertools
import json
import shutil
from pathlib import Path

import pytest

from mpsim.cli.main import main
from mpsim.errors import InputError
from mpsim.traces import load_trace, load_traces
from mpsim.traces.kinds import categorize
from mpsim.traces.summary import bus_factor, summarize

DATA = Path(__file__).parent / "data" / "traces"
CNN = str(DATA / "cnn_allreduce_step5.json.gz")
RECSYS8 = str(DATA / "recsys8_step1010.json.gz")
RECSYS16 = str(DATA / "recsys16_step551.json.gz")
H200 = str(DATA / "h200_gpipe_step3.json.gz")  # this project's own trace (README.md there)


@pytest.fixture(scope="module")
def recsys8():
    return load_trace(RECSYS8)


@pytest.fixture(scope="module")
def recsys16():
    return load_trace(RECSYS16)


@pytest.fixture(scope="module")
def cnn():
    return load_trace(CNN)


def by_correlation(trace, correlation: int):
    [kernel] = [k for k in trace.kernels if k.correlation == correlation]
    return kernel


def test_kernel_links_to_the_op_that_launched_it(recsys8):
    # Kernel correlation 1791951 (cutlass s1688gemm 256x64, 37 us) was launched by the
    # cudaLaunchKernel with correlation 1791951 at ts 1661203462710502 on thread 3126441 (the
    # autograd thread). Enclosing it there, outermost first: "autograd::engine::evaluate_function:
    # AddmmBackward0" (ts ...710444, 132 us), "AddmmBackward0" (...710445, 81 us) and
    # "aten::mm" (...710482, 39 us, Input Dims [[32, 1024], [1024, 5121]]). The kernel's own
    # External id is 1791951, not the op's 6608: only correlation plus time nesting links it.
    kernel = by_correlation(recsys8, 1791951)
    assert kernel.op is not None and kernel.op.name == "aten::mm"
    assert kernel.op.thread == 3126441
    assert kernel.op.input_dims == ((32, 1024), (1024, 5121))
    assert kernel.op.input_types == ("float", "float")
    assert len({kernel.op, kernel.op}) == 1  # hashable: kernels can be grouped by the op instance
    assert kernel.op_names == ("autograd::engine::evaluate_function: AddmmBackward0", "AddmmBackward0", "aten::mm")
    assert kernel.duration_s == pytest.approx(37e-6)
    assert kernel.step == 1010  # the launch (ts ...710502) lies in ProfilerStep#1010 (ts ...674288, 76940 us)


def test_gemm_shape_and_flops_of_a_known_mm(recsys8):
    # aten::mm [32, 1024] x [1024, 5121] on float inputs, run by a cutlass s1688gemm (TF32) kernel
    gemm = by_correlation(recsys8, 1791951).gemm
    assert (gemm.batch, gemm.m, gemm.k, gemm.n) == (1, 32, 1024, 5121)
    assert gemm.dtype == "tf32" and gemm.op == "aten::mm"
    assert gemm.flops == 2 * 32 * 1024 * 5121


# (cat, kernel name as the traces spell it, innermost op, category)
REAL_KERNELS = [
    ("kernel", ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_32x3_nt_align1>"
                "(cutlass_80_tensorop_s1688gemm_256x64_32x3_nt_align1::Params)"), "aten::mm", "gemm"),
    # the same cutlass GEMM kernel launched by cuDNN for a convolution's backward pass
    ("kernel", ("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4>"
                "(cutlass_80_tensorop_s1688gemm_256x64_16x4_nn_align4::Params)"), "aten::convolution_backward",
     "convolution"),
    ("kernel", ("sm80_xmma_wgrad_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x16_stage4_"
                "warpsize2x2x1_g1_tensor16x8x8_execute_kernel_cudnn_train"), None, "convolution"),
    ("kernel", ("void cudnn::ops::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)2>"
                "(cudnn::ops::nchw2nhwc_params_t<float>, float const*, float*)"), "aten::cudnn_convolution",
     "convolution"),
    ("kernel", ("void splitKreduce_kernel<float, float, float, float, true, false, false>(cublasSplitKParams<float>, "
                "float const*, float const*, float*, float const*, float const*, float const*, float const*, float*, "
                "void*, long, float*, int*)"), "aten::addmm", "gemm"),
    ("kernel", "ampere_sgemm_128x64_nn", None, "gemm"),
    ("kernel", "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "c10d::allreduce_",
     "collective"),
    ("kernel", "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)", None, "collective"),
    ("kernel", "void fbgemm_gpu::permute_2D_lengths_kernel<int>(int, int, int const*, int const*, int*)",
     "fbgemm::permute_2D_sparse_data", "elementwise"),
    ("kernel", ("void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>, float, float, float, float, "
                "float, float, float, float, adamMode_t, float, int, int, int>(int, int volatile*, "
                "TensorListMetadata<4>, AdamFunctor<float>, float, float, float, float, float, float, float, float, "
                "adamMode_t, float, int, int, int)"), "aten::_fused_adam_", "elementwise"),
    ("kernel", ("void at::native::vectorized_elementwise_kernel<2, at::native::CUDAFunctor_add<float>, "
                "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)"),
     "aten::add", "elementwise"),
    ("kernel", ("void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, int, 128, true, 1, true>(cudnnTensorStruct, "
                "float const*, cudnnTensorStruct, float*, float const*, float const*, float, float, float*, float*, "
                "float*, float*, float, float)"), "aten::cudnn_batch_norm", "elementwise"),
    ("kernel", ("void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel<float, float>(long, long, "
                "float const*, float const*, float const*, float const*, float*, float*)"),
     "aten::native_layer_norm_backward", "elementwise"),
    # cuBLAS 12.9+ on Hopper: generated kernels named nvjet_* (PyTorch 2.11, CUDA 13, H200); a GEMM by
    # its name, so its shape is read off the op that launched it
    ("kernel", "nvjet_sm90_tst_64x32_64x16_2x4_h_bz_bias_TNT", None, "gemm"),
    ("gpu_memcpy", "Memcpy DtoD (Device -> Device)", "aten::copy_", "memcpy"),
    ("gpu_memset", "Memset (Device)", "aten::zero_", "memset"),
]


@pytest.mark.parametrize("cat, name, op, category", REAL_KERNELS)
def test_category_of_real_kernel_names(cat, name, op, category):
    assert categorize(cat, name, op) == category


def test_bus_bandwidth_of_a_known_all_reduce(cnn):
    # the all-reduce kernel with correlation 40984: "In msg nelems" 2049000, dtype "Float",
    # "Group size" 2, dur 2520.607 us. nccl-tests: algbw = bytes / time, busbw = algbw x 2(n-1)/n.
    message_bytes = 2049000 * 4
    busbw = message_bytes / 2520.607e-6 * 2 * (2 - 1) / 2
    collective = by_correlation(cnn, 40984).collective
    assert (collective.kind, collective.group_size, collective.message_bytes) == ("all-reduce", 2, message_bytes)
    assert (collective.algorithm, collective.protocol) == ("RING", "LL")
    [row] = [r for r in summarize(cnn).collectives if r.message_bytes == message_bytes]
    assert row.count == 1 and row.busbw_bytes_per_s == pytest.approx(busbw)


def test_collective_sizes_from_the_enclosing_ops(recsys16, recsys8):
    # correlation 848352: a SendRecv kernel under c10d::_reduce_scatter_base_ with Input Dims
    # [[8192, 384], [65536, 384]] (output, input) of float: the input is the message; the group
    # is input / output = 8 ranks
    reduce_scatter = by_correlation(recsys16, 848352).collective
    assert (reduce_scatter.kind, reduce_scatter.message_bytes, reduce_scatter.group_size) == \
        ("reduce-scatter", 65536 * 384 * 4, 8)
    # correlation 859938: c10d::_allgather_base_ [[65536, 384], [8192, 384]]: the output is the message
    gather = by_correlation(recsys16, 859938).collective
    assert (gather.kind, gather.message_bytes, gather.group_size) == ("all-gather", 65536 * 384 * 4, 8)
    # correlation 855220: c10d::allreduce_ takes a tensor list (no dims); the nccl:all_reduce
    # annotation inside it records [[366336]] float; nothing records the group
    reduce = by_correlation(recsys16, 855220).collective
    assert (reduce.kind, reduce.message_bytes, reduce.group_size) == ("all-reduce", 366336 * 4, None)
    assert bus_factor("all-reduce", None) is None
    # an all-to-all that NCCL ran as SendRecv: the kind is the op's, the message its send buffer
    [all_to_all] = [k for k in recsys8.kernels if k.collective and k.duration_s == pytest.approx(4748e-6)]
    assert all_to_all.name.startswith("ncclKernel_SendRecv")
    assert (all_to_all.collective.kind, all_to_all.collective.message_bytes) == ("all-to-all", 8 * 1024 * 8816 * 4)


def _union_by_midpoints(intervals, lo, hi):
    """Seconds covered by ``intervals`` in [lo, hi], by testing each elementary segment."""
    points = sorted({lo, hi} | {min(max(t, lo), hi) for interval in intervals for t in interval})
    return sum(b - a for a, b in itertools.pairwise(points)
               if any(s <= (a + b) / 2 <= e for s, e in intervals))


@pytest.mark.parametrize("path", [CNN, RECSYS8, RECSYS16])
def test_busy_and_idle_add_up_to_the_step(path):
    # an extract keeps one step, so its window on the GPU runs from the first start to the
    # last end of the kernels launched in that step
    trace = load_trace(path)
    [step] = trace.steps
    summary = summarize(trace)
    assert summary.steps == (step.number,)
    assert summary.cpu_step_s == pytest.approx(step.end_s - step.start_s)
    launched = [k for k in trace.kernels if k.step == step.number]
    lo, hi = min(k.start_s for k in launched), max(k.end_s for k in launched)
    assert summary.span_s == pytest.approx(hi - lo)
    busy = _union_by_midpoints([(k.start_s, k.end_s) for k in trace.kernels], lo, hi)
    assert summary.busy_s == pytest.approx(busy, rel=1e-9)
    assert summary.busy_s + summary.idle_s == pytest.approx(summary.span_s, rel=1e-12)
    comms = [(k.start_s, k.end_s) for k in trace.kernels if k.category == "collective"]
    assert summary.collective_s == pytest.approx(_union_by_midpoints(comms, lo, hi), rel=1e-9)
    assert 0.0 <= summary.overlap_s <= summary.collective_s
    assert max(summary.category_s.values()) <= summary.busy_s + 1e-12


def test_device_and_rank_come_from_the_trace(recsys16):
    assert (recsys16.device_name, recsys16.device_sms, recsys16.compute_capability) == \
        ("NVIDIA A100-SXM4-80GB", 108, (8, 0))
    assert (recsys16.rank, recsys16.world_size) == (0, 16)
    assert list(recsys16.kernels) == sorted(recsys16.kernels, key=lambda k: k.start_s)


def test_a_folder_is_one_trace_per_rank_sorted_by_rank(tmp_path):
    for path in (RECSYS8, CNN):
        shutil.copy(path, tmp_path)
    traces = load_traces([str(tmp_path)])
    assert [t.rank for t in traces] == [0, 3]


def test_summary_command_prints_and_writes_json(tmp_path, capsys):
    out = tmp_path / "summary.json"
    assert main(["trace", "summary", CNN, "--json", str(out), "--top", "3"]) == 0
    text = capsys.readouterr().out
    assert "all-reduce" in text and "busbw" in text and "step 5" in text
    # the extract has no GEMM kernels: one line says so where an empty table would stand
    [gemm_line] = [line for line in text.splitlines() if "GEMM shapes" in line]
    assert gemm_line.strip() == "GEMM shapes: no GEMM kernels in the step"
    [data] = json.loads(out.read_text())
    assert data["rank"] == 0 and data["steps"] == [5]
    assert main(["trace", "summary", CNN, "--step", "4"]) == 2
    assert "ProfilerStep#4" in capsys.readouterr().err


def _bad_traces(tmp_path: Path) -> dict[str, Path]:
    whole = Path(RECSYS8).read_bytes()
    files = {"truncated gzip": ("cut.json.gz", whole[: len(whole) // 2]),
             "not JSON": ("text.json", b"this is not a trace\n"),
             "no traceEvents": ("empty.json", b'{"schemaVersion": 1}'),
             "no GPU kernels": ("cpu.json", json.dumps({"traceEvents": [
                 {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 5}]}).encode()),
             "gzip of not JSON": ("junk.json.gz", gzip.compress(b"{not json", mtime=0))}
    paths = {}
    for problem, (name, data) in files.items():
        paths[problem] = tmp_path / name
        paths[problem].write_bytes(data)
    paths["missing file"] = tmp_path / "absent.json"
    return paths


def test_bad_traces_exit_2_with_one_line(tmp_path, capsys):
    for problem, path in _bad_traces(tmp_path).items():
        assert main(["trace", "summary", str(path)]) == 2, problem
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("error: ") and path.name in err, (problem, err)
        with pytest.raises(InputError):
            load_trace(str(path))


def _tiny_trace(tmp_path: Path) -> str:
    """Two steps of 100 us on the CPU; kernels launched at 10, 20 (step 1) and 110 us (step 2)
    run at 50-80 us (stream 7), 70-110 us (an all-reduce on stream 8) and 150-170 us."""
    def runtime(correlation, ts):
        return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts, "dur": 2,
                "args": {"correlation": correlation}}

    def kernel(correlation, name, ts, dur, stream, **args):
        return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
                "args": {"correlation": correlation, "stream": stream, "device": 0, **args}}

    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "pid": 1, "tid": 1, "ts": 100, "dur": 100},
        runtime(1, 10), runtime(2, 20), runtime(3, 110),
        kernel(1, "elementwise_kernel", 50, 30, 7),
        kernel(2, "ncclKernel_AllReduce_RING_LL_Sum_float", 70, 40, 8, **{"In msg nelems": 1000, "dtype": "Float",
                                                                        "Group size": 4}),
        kernel(3, "elementwise_kernel", 150, 20, 7),
    ]
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return str(path)


def test_step_windows_follow_the_kernels_launched_in_them(tmp_path):
    trace = load_trace(_tiny_trace(tmp_path))
    assert [k.step for k in trace.kernels] == [1, 1, 2]
    # step 1's window: 50 us (its first kernel) to 150 us (step 2's first kernel); busy 50-110
    one = summarize(trace, step=1)
    assert (one.span_s, one.busy_s, one.idle_s) == pytest.approx((100e-6, 60e-6, 40e-6))
    assert (one.collective_s, one.overlap_s, one.overlap_share) == pytest.approx((40e-6, 10e-6, 0.25))
    # step 2's window: 150 to 170 us, all busy; the mean of the two windows
    both = summarize(trace)
    assert (both.span_s, both.busy_s, both.idle_s) == pytest.approx((60e-6, 40e-6, 20e-6))
    # 1000 floats among 4 ranks in 40 us: algbw 4000 B / 40 us, busbw x 2 (4 - 1) / 4
    [row] = both.collectives
    assert row.algbw_bytes_per_s == pytest.approx(4000 / 40e-6)
    assert row.busbw_bytes_per_s == pytest.approx(4000 / 40e-6 * 2 * 3 / 4)


def test_flow_events_link_a_kernel_whose_runtime_call_is_missing(tmp_path):
    # the same extract without its cuda_runtime events: the async_cpu_to_gpu flow that starts
    # on the launching thread (id = the correlation) still places the launch inside aten::mm
    top = json.loads(gzip.decompress(Path(RECSYS8).read_bytes()))
    top["traceEvents"] = [e for e in top["traceEvents"] if e.get("cat") != "cuda_runtime"]
    path = tmp_path / "no_runtime.json"
    path.write_text(json.dumps(top))
    kernel = by_correlation(load_trace(str(path)), 1791951)
    assert kernel.op is not None and kernel.op.name == "aten::mm" and kernel.gemm is not None


def test_a_hopper_cublas_kernel_takes_its_shape_from_its_addmm():
    from mpsim.traces.kinds import rule_for
    from mpsim.traces.model import CpuOp
    from mpsim.traces.shapes import gemm_of

    name = "nvjet_sm90_tst_64x32_64x16_2x4_h_bz_bias_TNT"
    assert rule_for("kernel", name, "aten::addmm").field == "name"  # the product itself, not a helper
    op = CpuOp("aten::addmm", 0.0, 1e-4, 1, input_dims=((1536,), (128, 512), (512, 1536), (), ()),
               input_types=("c10::BFloat16", "c10::BFloat16", "c10::BFloat16", "Scalar", "Scalar"))
    gemm = gemm_of(name, (op,))
    assert (gemm.batch, gemm.m, gemm.n, gemm.k, gemm.dtype) == (1, 128, 1536, 512, "bf16")


def test_an_h200_trace_links_cublas_driver_launches_to_their_shapes():
    """This project's own H200 trace (tests/data/traces/README.md): cuBLAS launches its nvjet
    kernels through the driver (cuLaunchKernelEx), and every one of them gets its shape."""
    from mpsim.traces.host import launch_intervals_by_pass

    trace = load_trace(H200)
    assert trace.device_name == "NVIDIA H200"
    gemms = [k for k in trace.kernels if k.category == "gemm"]
    assert len(gemms) > 20 and all(k.name.startswith("nvjet_") and k.gemm is not None for k in gemms)
    # the validation model in bf16, 128 tokens per microbatch: every product has them on one side
    assert all(k.gemm.dtype == "bf16" and 128 in (k.gemm.m, k.gemm.n, k.gemm.k) for k in gemms)
    forward, backward = launch_intervals_by_pass(trace)
    assert forward and backward  # the training loop's thread and the autograd engine's
