"""An accelerator (GPU, TPU, ...): what its datasheet promises and how close kernels get.

Peak numbers are dense (no 2:4 sparsity). The ``efficiency`` block says how much of
the peak real kernels reach, per kind of op, because one number is not enough: GEMMs
follow the best measured matmul throughput scaled by how well the output tiles fill the
chip (wave quantization) and how long each tile's main loop runs against its fixed load
and store phases (``gemm_tile_k``), memory-bound ops follow the HBM bandwidth, fused
attention kernels have their own published fraction of peak.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from mpsim.specs.base import Spec
from mpsim.units import Bandwidth, Bytes, FlopRate, Seconds

DType = Literal["fp32", "tf32", "bf16", "fp16", "fp8"]

BYTES_PER_ELEMENT: dict[str, int] = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1}


class MemorySpec(Spec):
    """Device memory (HBM): capacity and peak bandwidth."""

    capacity: Bytes = Field(gt=0)
    bandwidth: Bandwidth = Field(gt=0)


class EfficiencySpec(Spec):
    """Fractions of peak that real kernels reach on this device."""

    gemm: float = Field(gt=0, le=1, description="best measured matmul throughput / peak")
    gemm_fp8: float | None = Field(None, gt=0, le=1, description="the same for fp8 GEMMs / fp8 peak; absent: "
                                                                 "as gemm")
    gemm_tile: tuple[int, int] = Field(
        (128, 256), description="output tile (rows, cols) of large-GEMM kernels, for wave quantization"
    )
    gemm_tile_k: int | None = Field(64, gt=0, description="depth along K of one main-loop step of those kernels: "
                                                          "a tile's operands are loaded this many columns at a "
                                                          "time; null: tiles are fed from caches (a CPU), no "
                                                          "load and store phases")
    memory: float = Field(gt=0, le=1, description="achieved / peak HBM bandwidth for streaming ops")
    attention_forward: float = Field(gt=0, le=1, description="fused attention forward, fraction of peak")
    attention_backward: float = Field(gt=0, le=1, description="fused attention backward, fraction of peak")
    kernel_overhead: Seconds = Field(ge=0, description="fixed cost per kernel (launch gap)")


class AcceleratorSpec(Spec):
    """One accelerator model, from its datasheet."""

    name: str
    vendor: str = ""
    description: str = ""
    peak_flops: dict[DType, FlopRate]
    memory: MemorySpec
    compute_units: int = Field(gt=0, description="SMs / CUs / cores: parallel units GEMM tiles fill")
    efficiency: EfficiencySpec

    @model_validator(mode="after")
    def _positive_peaks(self) -> "AcceleratorSpec":
        for dtype, value in self.peak_flops.items():
            if value <= 0:
                raise ValueError(f"peak_flops.{dtype} must be positive, got {value}")
        return self

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for ``dtype``."""
        return self.peak_flops[dtype]  # type: ignore[index]
