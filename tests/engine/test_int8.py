"""Int8 linear layers: close to the float layer they replace, and swapped in place."""

from __future__ import annotations

import pytest
import torch

from engine.loading import resolve_quantize
from engine.whisper.int8 import Int8Linear, int8_available, quantize_linears
from server.engine_plan import model_config_with

pytestmark = pytest.mark.skipif(not int8_available(), reason="no fbgemm/x86 int8 kernels")


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 64), (5, 64), (2, 3, 64)])
def test_int8_linear_matches_the_float_layer(bias: bool, shape: tuple[int, ...]) -> None:
    """Outputs agree with the float layer to ~1 % of their spread, in the same shape."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 96, bias=bias)
    x = torch.randn(*shape)
    with torch.inference_mode():
        expected = linear(x)
        got = Int8Linear(linear)(x)
    assert got.shape == expected.shape == (*shape[:-1], 96)
    error = (got - expected).abs().max().item()
    assert error < 0.02 * expected.abs().max().item(), error
    assert not torch.equal(got, expected)  # it really is another kernel


def test_int8_keeps_the_argmax_of_a_vocabulary_projection() -> None:
    """A Whisper-sized vocabulary projection picks the same token for 32 hidden states."""
    torch.manual_seed(1)
    projection = torch.nn.Linear(384, 51_864, bias=False)
    hidden = torch.randn(32, 384) * 4
    with torch.inference_mode():
        logits = projection(hidden)
        quantized = Int8Linear(projection)(hidden)
    top2 = logits.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.05  # ties within the rounding may flip
    assert clear.sum() >= 24
    assert torch.equal(logits.argmax(-1)[clear], quantized.argmax(-1)[clear])


def test_quantize_linears_swaps_nested_layers_and_shares_the_rest() -> None:
    """Every nn.Linear at any depth becomes an Int8Linear; other modules stay as they were."""
    norm = torch.nn.LayerNorm(8)
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 8), norm, torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.GELU())
    )
    assert quantize_linears(model) == 2
    inner = model[2]
    assert isinstance(inner, torch.nn.Sequential)
    assert isinstance(model[0], Int8Linear) and isinstance(inner[0], Int8Linear)
    assert model[1] is norm
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    with torch.inference_mode():
        assert model(torch.randn(3, 8)).shape == (3, 4)


def test_int8_refuses_other_dtypes() -> None:
    layer = Int8Linear(torch.nn.Linear(4, 4))
    with pytest.raises(TypeError, match="float32"), torch.inference_mode():
        layer(torch.randn(2, 4, dtype=torch.float64))


def test_a_rows_output_does_not_depend_on_its_batch() -> None:
    """Activations are quantized per row: a row's output is bit for bit the same alone, in
    a batch with rows 10,000 times larger or smaller, and inside a many-token pass."""
    torch.manual_seed(2)
    layer = Int8Linear(torch.nn.Linear(64, 96))
    rows = torch.randn(8, 64) * torch.logspace(-2, 2, 8)[:, None]
    with torch.inference_mode():
        together = layer(rows)
        passes = layer(rows.reshape(2, 4, 64))
        for i in range(8):
            assert torch.equal(layer(rows[i : i + 1])[0], together[i]), i
        assert torch.equal(passes.reshape(8, 96), together)


@pytest.mark.parametrize("reduce_range", [True, False])
def test_each_row_uses_the_whole_grid_unclipped(reduce_range: bool) -> None:
    """A row's largest magnitude, either sign, is on the grid: no clipping at +1 or -1,
    and rows of any magnitude (or none) come out as accurately as a unit row."""
    linear = torch.nn.Linear(4, 3, bias=False)
    linear.weight.data = torch.tensor([[1.0, 0, 0, 0], [0, 1.0, 0, 0], [0.5, -0.5, 0.25, 0]])
    layer = Int8Linear(linear, reduce_range=reduce_range)
    x = torch.tensor([[1.0, -1.0, 0.5, 0.0], [-3e4, 3e4, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
    with torch.inference_mode():
        got = layer(x)
        expected = linear(x)
    assert torch.allclose(got[0, :2], expected[0, :2], rtol=1e-6)  # +1 and -1 exactly
    assert torch.allclose(got, expected, rtol=0.02, atol=1e-6)
    assert torch.equal(got[2], torch.zeros(3))


def test_auto_shortlists_in_int8_on_the_cpu_in_float32_only() -> None:
    """`PARLEY_QUANTIZE=auto`: the int8 shortlist of the vocabulary projection on the CPU
    in float32; nothing on cuda or in another dtype; an explicit choice is kept."""
    assert resolve_quantize(model_config_with(), "cpu") == "int8-shortlist"
    assert resolve_quantize(model_config_with(dtype="float32"), "cpu") == "int8-shortlist"
    assert resolve_quantize(model_config_with(quantize="int8-decoder"), "cpu") == "int8-decoder"
    assert resolve_quantize(model_config_with(), "cuda") == "none"
    assert resolve_quantize(model_config_with(dtype="bfloat16"), "cpu") == "none"
    assert resolve_quantize(model_config_with(quantize="none"), "cpu") == "none"
    assert resolve_quantize(model_config_with(quantize="int8"), "cpu") == "int8"
