"""GPU peaks from the vendors' datasheets: dense TFLOP/s per dtype and memory bandwidth, by device name.

Dense figures only (the datasheets' headline tensor figures are with 2:4 sparsity: half of those). Each
dtype's figure is the fastest the hardware runs on inputs of that dtype, because a roof must bound every
kernel: float32 is the TF32 tensor-core rate where there is one (a kernel may run float32 inputs on it:
Triton's ``tl.dot`` does by default), float64 the FP64 tensor-core rate where there is one, float16 and
bfloat16 the tensor-core rate with FP32 accumulation (what attention kernels use; GeForce cards run FP16
accumulation twice as fast), float8_e4m3fn the FP8 tensor-core rate (Hopper; an fp8 forward's dots). A dtype a
card has no figure for falls back to the measured matmul rate.

A device matches the first entry whose pattern is found in ``torch.cuda.get_device_name()``
(case-insensitive, so the more specific variants come first).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Datasheet:
    name: str  # the product, as recorded in the ceilings' source ("datasheet H100 SXM")
    pattern: str  # regular expression searched in the device name
    tflops: dict[str, float]  # dense TFLOP/s by dtype
    gbps: float  # memory bandwidth, GB/s


def _peaks(
    fp64: float, fp32: float, half: float, bf16: float | None = None, fp8: float | None = None
) -> dict[str, float]:
    peaks = {"float64": fp64, "float32": fp32, "float16": half}
    if bf16 is not None:
        peaks["bfloat16"] = bf16
    if fp8 is not None:
        peaks["float8_e4m3fn"] = fp8
    return peaks


SHEETS = (
    Datasheet("H100 NVL", r"\bH100\b.*\bNVL\b", _peaks(60, 417.5, 835.5, 835.5, 1670.5), 3900),
    Datasheet("H100 PCIe", r"\bH100\b.*\bPCIe\b", _peaks(51.2, 378, 756, 756, 1513), 2000),
    Datasheet("H100 SXM", r"\bH100\b", _peaks(67, 494.7, 989.4, 989.4, 1978.9), 3350),  # "NVIDIA H100 80GB HBM3"
    Datasheet("H200 NVL", r"\bH200\b.*\bNVL\b", _peaks(60, 417.5, 835.5, 835.5, 1670.5), 4800),
    Datasheet("H200 SXM", r"\bH200\b", _peaks(67, 494.7, 989.4, 989.4, 1978.9), 4800),
    Datasheet("A100 PCIe 80GB", r"\bA100\b.*(80GB.*PCIe|PCIe.*80GB)", _peaks(19.5, 156, 312, 312), 1935),
    Datasheet("A100 PCIe 40GB", r"\bA100\b.*PCIe", _peaks(19.5, 156, 312, 312), 1555),
    Datasheet("A100 SXM 40GB", r"\bA100\b.*40GB", _peaks(19.5, 156, 312, 312), 1555),
    Datasheet("A100 SXM 80GB", r"\bA100\b", _peaks(19.5, 156, 312, 312), 2039),
    Datasheet("L40S", r"\bL40S\b", _peaks(1.43, 183, 362.05, 362.05), 864),
    Datasheet("L40", r"\bL40\b", _peaks(1.41, 90.5, 181.05, 181.05), 864),
    Datasheet("L4", r"\bL4\b", _peaks(0.47, 60, 121, 121), 300),
    Datasheet("A10", r"\bA10\b", _peaks(0.98, 62.5, 125, 125), 600),
    Datasheet("RTX 4090", r"RTX 4090", _peaks(1.29, 82.6, 165.2, 165.2), 1008),
    Datasheet("RTX 3090", r"RTX 3090(?! Ti)", _peaks(0.56, 35.6, 71, 71), 936),
    Datasheet("MI300X", r"\bMI300X\b", _peaks(163.4, 653.7, 1307.4, 1307.4), 5300),
    Datasheet("V100 SXM2", r"\bV100\b.*SXM", _peaks(7.8, 15.7, 125), 900),
    Datasheet("V100 PCIe", r"\bV100\b", _peaks(7, 14, 112), 900),
    Datasheet("T4", r"\bT4\b", _peaks(0.25, 8.1, 65), 320),
)


def lookup(device_name: str) -> Datasheet | None:
    """The datasheet of ``device_name`` (e.g. "NVIDIA H100 80GB HBM3" → H100 SXM), or None if unknown."""
    for sheet in SHEETS:
        if re.search(sheet.pattern, device_name, flags=re.IGNORECASE):
            return sheet
    return None
