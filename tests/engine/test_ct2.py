"""The CTranslate2 model.bin reader, on files written here and on the packaged model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.whisper.ct2 import Ct2FormatError, read_model
from engine.whisper.weights import PACKAGED_MODELS
from tests.support.ct2_writer import ct2_bytes, write_parts

VARIABLES = {
    "decoder/embeddings/weight": torch.arange(12, dtype=torch.float16).reshape(4, 3),
    "decoder/num_heads": torch.tensor(6, dtype=torch.int16),
    "encoder/bf16": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
    "encoder/int8": torch.tensor([[1, -2], [3, 4]], dtype=torch.int8),
    "encoder/f32": torch.tensor([0.25], dtype=torch.float32),
}
ALIASES = {"decoder/projection/weight": "decoder/embeddings/weight"}


def test_reads_every_dtype_shape_and_alias(tmp_path: Path) -> None:
    """Variables come back bit-exact with their dtype and shape; aliases resolve."""
    path = tmp_path / "model.bin"
    path.write_bytes(ct2_bytes(VARIABLES, ALIASES))
    model = read_model([path])
    assert (model.spec, model.revision) == ("WhisperSpec", 3)
    assert model.variables.keys() == VARIABLES.keys()
    for name, expected in VARIABLES.items():
        assert model.variables[name].dtype == expected.dtype
        assert torch.equal(model.variables[name], expected)
    assert model.scalar("decoder/num_heads") == 6
    assert torch.equal(
        model.resolve("decoder/projection/weight"), VARIABLES["decoder/embeddings/weight"]
    )


def test_parts_split_anywhere_read_as_one_file(tmp_path: Path) -> None:
    """A model split into parts at arbitrary bytes reads the same as the whole file."""
    data = ct2_bytes(VARIABLES, ALIASES)
    parts = write_parts(data, tmp_path, [3, 40, 41, len(data) - 2])
    model = read_model(parts)
    for name, expected in VARIABLES.items():
        assert torch.equal(model.variables[name], expected)
    assert model.aliases == ALIASES


def test_packaged_model_split_in_two_reads_identically(tmp_path: Path) -> None:
    """tiny.en's model.bin cut in two (as base/small ship) parses to the same variables."""
    source = PACKAGED_MODELS["tiny.en"]()
    data = source.model_parts[0].read_bytes()
    whole = read_model(source.model_parts)
    split = read_model(write_parts(data, tmp_path, [len(data) // 2 + 7]))
    assert whole.variables.keys() == split.variables.keys()
    assert all(torch.equal(whole.variables[k], split.variables[k]) for k in whole.variables)
    assert (
        whole.aliases == split.aliases == {"decoder/projection/weight": "decoder/embeddings/weight"}
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (ct2_bytes(VARIABLES, version=2), "binary version 2"),
        (ct2_bytes(VARIABLES)[:-9], "truncated"),
        (ct2_bytes(VARIABLES) + b"\0", "trailing bytes"),
        (ct2_bytes(VARIABLES, {"a": "missing"}), "unknown variable"),
    ],
    ids=["old-version", "truncated", "trailing", "dangling-alias"],
)
def test_malformed_files_are_rejected(tmp_path: Path, data: bytes, message: str) -> None:
    """Unsupported versions, truncation, trailing bytes and bad aliases raise."""
    path = tmp_path / "model.bin"
    path.write_bytes(data)
    with pytest.raises(Ct2FormatError, match=message):
        read_model([path])
