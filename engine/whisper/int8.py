"""Int8 linear layers for CPU inference, with activations quantized per row.

On CPU, a small Whisper's decoding is bound by memory bandwidth, not arithmetic: each
decoder step reads every weight once for a handful of rows, and the largest weight by far
is the vocabulary projection (51,864 × 384 floats, 80 MB, for tiny). Stored as int8 with
one scale per output channel it is a quarter of the bytes, and fbgemm's dynamic kernel
(`quantized::linear_dynamic`) quantizes the activations to 8 bits (7 with
`reduce_range`, which CPUs without VNNI need to keep their 16-bit accumulators from
saturating) and multiplies in integers.

Per row, not per call. That kernel picks one activation scale and zero point for the whole
call, from the minimum and maximum of every row in it, so a row's result depended on its
batch-mates, and a many-token draft check rounded differently from single steps (the
streaming WER rose:
docs/history/2026-11-29-first-measurements.md#accuracy-of-int8-and-drafts). Here each row
is first divided by its own largest magnitude, so every row lies in [-1, 1], and one fixed
calibration row that spans exactly the kernel's grid (zero point in the middle, no
clipping) is appended: the kernel then always chooses the same scale and zero point,
whatever else is in the call, and each row is quantized on a grid of its own magnitude.
The integer products are exact and the rescaling is per element, so a row's output is bit
for bit the same alone, in any batch, and at any position of a many-token pass
(tests/engine/test_int8.py checks it). The cost over the per-call kernel is a few
element-wise operations and one extra row.

Why these low-level ops and not `torch.ao.quantization.quantize_dynamic`: that API is
deprecated in torch 2.13 and warns on every call, and its successor (torchao's
`quantize_`) has no fast CPU kernel without `torch.compile` (measured slower than float32
at every batch size). `aten._weight_int8pack_mm` (int8 weights, float activations, no
activation rounding at all) runs only in bfloat16 at speed here: 25x slower than this in
float32 (bench/step.py). The kernel itself is not deprecated; creating its packed weight
goes through a quantized tensor, whose constructor warns that quantized dtypes are on
their way out, so that one step runs with that warning silenced. torch is pinned
(pyproject.toml), so this cannot break under us unnoticed: the tests run the int8 model on
real speech.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

# The deprecation notice torch attaches to creating quantized tensors (see module doc).
_QUANTIZED_TENSOR_NOTICE = r"torch\.quantize_per_tensor, torch\.quantize_per_channel"
# Unsigned activation levels the kernel uses: 0..127 with reduce_range, else 0..255.
_LEVELS = {True: 127, False: 255}


def int8_available() -> bool:
    """Whether this torch build has the fbgemm/x86 kernels `Int8Linear` needs."""
    engines = torch.backends.quantized.supported_engines
    return "fbgemm" in engines or "x86" in engines


def _calibration(in_features: int, reduce_range: bool) -> torch.Tensor:
    """One row whose range is exactly the grid [-(m+1)/m, 1] with m = levels // 2: the
    kernel's scale is then 1/m and its zero point m+1 (or m), an integer, so +1 and -1
    are on the grid and nothing a unit row holds is clipped."""
    half = _LEVELS[reduce_range] // 2
    row = torch.zeros(1, in_features)
    row[0, 0] = 1.0
    row[0, 1] = -(half + 1) / half
    return row


class Int8Linear(torch.nn.Module):
    """A frozen `nn.Linear` with int8 weights (symmetric, one scale per output channel) and
    activations quantized per row (see the module doc): a row's output does not depend on
    the other rows of the call.

    CPU only and inference only. The float weight is not kept (it may still be shared with
    another module, such as Whisper's token embedding tied to its output projection).
    """

    def __init__(self, linear: torch.nn.Linear, *, reduce_range: bool = True) -> None:
        super().__init__()
        weight = linear.weight.detach().float()
        if weight.device.type != "cpu":
            raise ValueError("Int8Linear runs on the CPU only")
        if linear.in_features < 2:
            raise ValueError("Int8Linear needs at least 2 input features")
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self._reduce_range = reduce_range
        # The bias is added after the per-row rescaling, so the kernel gets none.
        self._bias = None if linear.bias is None else linear.bias.detach().float().clone()
        self._calibration = _calibration(self.in_features, reduce_range)
        scales = weight.abs().amax(dim=1).clamp(min=1e-8).double() / 127.0
        zero_points = torch.zeros(self.out_features, dtype=torch.long)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_QUANTIZED_TENSOR_NOTICE)
            quantized = torch.quantize_per_channel(weight, scales, zero_points, 0, torch.qint8)
            self._packed = torch.ops.quantized.linear_prepack(quantized, None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.dtype != torch.float32:
            raise TypeError(f"Int8Linear takes float32 input, got {rows.dtype}")
        magnitude = rows.abs().amax(dim=1, keepdim=True).clamp(min=1e-30)
        unit = torch.cat([rows / magnitude, self._calibration])
        kernel = torch.ops.quantized.linear_dynamic
        out: torch.Tensor = kernel(unit, self._packed, self._reduce_range)[:-1]
        out = out * magnitude if self._bias is None else torch.addcmul(self._bias, out, magnitude)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def quantize_linears(
    module: torch.nn.Module, where: Callable[[str], bool] = lambda name: True, prefix: str = ""
) -> int:
    """Replace every `nn.Linear` inside `module` (`module` itself cannot be one) whose
    dotted name (from `module`, e.g. `model.decoder.layers.0.fc1`) `where` accepts by an
    `Int8Linear`, in place; returns how many were replaced."""
    replaced = 0
    for name, child in list(module.named_children()):
        path = f"{prefix}{name}"
        if isinstance(child, torch.nn.Linear):
            if where(path):
                setattr(module, name, Int8Linear(child))
                replaced += 1
        else:
            replaced += quantize_linears(child, where, f"{path}.")
    return replaced
