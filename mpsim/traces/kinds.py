"""Which kind of work a GPU kernel is, decided by an ordered list of rules.

A kernel's name alone is not enough: cuDNN runs a convolution's weight gradient as an
implicit GEMM whose name says "gemm", and cuBLAS's split-K reduction after a matrix
product is named like any other reduction. So a rule may look at the event's ``cat``, the
kernel's name, or the innermost CPU op that launched it, and the first rule that matches
decides. The rules are data (``RULES``) so that a new kernel family is one line here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from mpsim.traces.model import CATEGORIES


@dataclass(frozen=True)
class Rule:
    """Kernels whose ``field`` (``cat``, ``name`` or ``op``) matches ``pattern`` are ``category``."""

    field: str
    pattern: re.Pattern
    category: str
    why: str


def _rule(field: str, pattern: str, category: str, why: str) -> Rule:
    assert category in CATEGORIES and field in ("cat", "name", "op")
    return Rule(field, re.compile(pattern, re.IGNORECASE), category, why)


# Aten ops whose kernels are all matrix products (their helper kernels included).
GEMM_OPS = r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|addmv|mv|_addmm_activation|addbmm)$"
# Aten ops of a convolution, forward or backward (cuDNN's layout transforms included).
CONVOLUTION_OPS = r"^aten::(convolution|_convolution|cudnn_convolution\w*|convolution_backward|conv\dd|" \
                  r"conv_transpose\dd|miopen_convolution\w*|mkldnn_convolution)$"
ATTENTION_OPS = r"^aten::(_scaled_dot_product\w*|scaled_dot_product_attention|_flash_attention\w*|" \
                r"_efficient_attention\w*|_cudnn_attention\w*)$"

RULES: tuple[Rule, ...] = (
    # Copies and fills are their own activity kinds in the trace; the name is just "Memcpy HtoD".
    _rule("cat", r"^gpu_memcpy$", "memcpy", "the runtime's copy engine or copy kernel"),
    _rule("cat", r"^gpu_memset$", "memset", "the runtime's memset"),
    # NCCL names every kernel ncclKernel_<Coll>_... (ncclDevKernel_... since 2.19).
    _rule("name", r"^nccl", "collective", "an NCCL collective or point-to-point kernel"),
    # Fused attention: FlashAttention, xformers/cutlass fmha, cuDNN's SDPA.
    _rule("name", r"flash|fmha|sdpa|attention", "attention", "a fused attention kernel"),
    _rule("op", ATTENTION_OPS, "attention", "launched by an attention op"),
    # The enclosing op decides before the name: conv wgrad kernels are implicit GEMMs.
    _rule("op", CONVOLUTION_OPS, "convolution", "launched by a convolution op"),
    # Convolution kernels by name when the op is unknown: implicit GEMM, xmma and cutlass
    # fprop/dgrad/wgrad, cuDNN's own scudnn and winograd kernels.
    _rule("name", r"implicit_?gemm|implicitconvolution|xmma_(fprop|dgrad|wgrad)|s1688(fprop|dgrad|wgrad)|"
                  r"s16816(fprop|dgrad|wgrad)|h1688(fprop|dgrad|wgrad)|h16816(fprop|dgrad|wgrad)|"
                  r"scudnn|winograd|cudnn::cnn|conv2d|convolve", "convolution", "a convolution kernel"),
    # Inductor's Triton matrix-product templates.
    _rule("name", r"^triton_(tem|mm|bmm)", "gemm", "a Triton matrix-product template"),
    # Matrix products by name: cutlass and cuBLAS GEMM/GEMV kernels in all their spellings,
    # cuBLAS 12.9+ on Hopper and Blackwell among them: its generated kernels are named
    # ``nvjet_sm90_tst_<tile>_..._<layouts>`` (seen in a PyTorch 2.11 / CUDA 13 trace on an H200).
    _rule("name", r"(?<!fb)gemm|gemv|xmma_|cutlass.*tensorop|^sm\d\d_|^ampere_|^volta_|^turing_|^hopper_|"
                  r"^nvjet_",
          "gemm", "a cutlass or cuBLAS matrix-product kernel"),
    # Anything else a matrix-product op launched (split-K reductions, epilogues).
    _rule("op", GEMM_OPS, "gemm", "launched by a matrix-product op"),
    # Memory-bound work: ATen's elementwise and reduction templates, copies, indexing,
    # normalisation, softmax, embeddings, optimizer multi-tensor kernels, fbgemm
    # permutes, cub sorts and scans, Inductor's pointwise and reduction kernels.
    _rule("name", r"elementwise|reduce|norm|softmax|copy|index|embedding|multi_tensor_apply|foreach|"
                  r"permute|fill|scatter|gather|cub::|bucketize|scan|sort|nchwtonhwc|nhwctonchw|bn_(fw|bw)|"
                  r"concat|cat_|dropout|adam|adagrad|sgd|bounds_check|linearize|offsets|recat|to_dense|"
                  r"^triton_|transpose|where|masked|topk|unique|histogram|compact|pool|gammabeta|layer_?norm", "elementwise",
          "a memory-bound kernel"),
)


def categorize(cat: str, name: str, innermost_op: str | None) -> str:
    """The category (one of ``CATEGORIES``) of a GPU event: ``cat`` from the trace, the
    kernel's ``name``, and the name of the innermost CPU op that launched it (None when
    the launch is not linked)."""
    rule = rule_for(cat, name, innermost_op)
    return rule.category if rule is not None else "other"


@lru_cache(maxsize=65536)  # a trace repeats a few hundred names; kernel names are long to search
def rule_for(cat: str, name: str, innermost_op: str | None) -> Rule | None:
    """The rule that decides the category (None: nothing matched, the kernel is ``other``)."""
    values = {"cat": cat, "name": name, "op": innermost_op}
    for rule in RULES:
        value = values[rule.field]
        if value is not None and rule.pattern.search(value):
            return rule
    return None
