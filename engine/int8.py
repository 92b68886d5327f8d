"""Int8 linear layers for CPU inference, through torch's fbgemm dynamic-quantization kernel.

On CPU, a small Whisper's decoding is bound by memory bandwidth, not arithmetic: each
decoder step reads every weight once for a handful of rows, and the largest weight by far
is the vocabulary projection (51,864 × 384 floats, 80 MB, for tiny). Stored as int8 with
one scale per output channel it is a quarter of the bytes, and fbgemm's kernel quantizes
the activations on the fly (per call, to 7 bits: `reduce_range`, which CPUs without VNNI
need to keep their 16-bit accumulators from saturating) and multiplies in integers. On the
2-core dev machine that makes the vocabulary projection ~10x faster at one row and ~5x at
16 (docs/performance.md).

Why these low-level ops and not `torch.ao.quantization.quantize_dynamic`: that API is
deprecated in torch 2.13 and warns on every call, and its successor (torchao's
`quantize_`) has no fast CPU kernel without `torch.compile` (measured slower than float32
at every batch size). The kernel itself (`quantized::linear_dynamic`) is not deprecated;
creating its packed weight goes through a quantized tensor, whose constructor warns that
quantized dtypes are on their way out, so that one step runs with that warning silenced.
torch is pinned (pyproject.toml), so this cannot break under us unnoticed: the tests run
the int8 model on real speech.
"""

from __future__ import annotations

import warnings

import torch

# The deprecation notice torch attaches to creating quantized tensors (see module doc).
_QUANTIZED_TENSOR_NOTICE = r"torch\.quantize_per_tensor, torch\.quantize_per_channel"


def int8_available() -> bool:
    """Whether this torch build has the fbgemm/x86 kernels `Int8Linear` needs."""
    engines = torch.backends.quantized.supported_engines
    return "fbgemm" in engines or "x86" in engines


class Int8Linear(torch.nn.Module):
    """A frozen `nn.Linear` with int8 weights (symmetric, one scale per output channel).

    CPU only and inference only. The float weight is not kept (it may still be shared with
    another module, such as Whisper's token embedding tied to its output projection).
    """

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach().float()
        if weight.device.type != "cpu":
            raise ValueError("Int8Linear runs on the CPU only")
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        bias = None if linear.bias is None else linear.bias.detach().float()
        scales = weight.abs().amax(dim=1).clamp(min=1e-8).double() / 127.0
        zero_points = torch.zeros(self.out_features, dtype=torch.long)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_QUANTIZED_TENSOR_NOTICE)
            quantized = torch.quantize_per_channel(weight, scales, zero_points, 0, torch.qint8)
            self._packed = torch.ops.quantized.linear_prepack(quantized, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        if rows.dtype != torch.float32:
            raise TypeError(f"Int8Linear takes float32 input, got {rows.dtype}")
        kernel = torch.ops.quantized.linear_dynamic
        out: torch.Tensor = kernel(rows.contiguous(), self._packed, True)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def quantize_linears(module: torch.nn.Module) -> int:
    """Replace every `nn.Linear` inside `module` (and `module` itself cannot be one) by an
    `Int8Linear`, in place; returns how many were replaced."""
    replaced = 0
    for name, child in list(module.named_children()):
        if isinstance(child, torch.nn.Linear):
            setattr(module, name, Int8Linear(child))
            replaced += 1
        else:
            replaced += quantize_linears(child)
    return replaced
