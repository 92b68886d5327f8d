"""Writes CTranslate2 model.bin files, the way CTranslate2's `ModelSpec._serialize` does."""

from __future__ import annotations

import itertools
import struct
from pathlib import Path

import torch

from engine.whisper.ct2 import DTYPES


def _string(text: str) -> bytes:
    data = text.encode("utf-8") + b"\0"
    return struct.pack("<H", len(data)) + data


def ct2_bytes(
    variables: dict[str, torch.Tensor],
    aliases: dict[str, str] | None = None,
    *,
    version: int = 6,
    spec: str = "WhisperSpec",
) -> bytes:
    out = [struct.pack("<I", version), _string(spec), struct.pack("<I", 3)]
    out.append(struct.pack("<I", len(variables)))
    for name, tensor in sorted(variables.items()):
        raw = tensor.reshape(-1).view(torch.uint8).numpy().tobytes()
        out.append(_string(name))
        out.append(struct.pack("<B", tensor.dim()))
        out.extend(struct.pack("<I", dim) for dim in tensor.shape)
        out.append(struct.pack("<BI", DTYPES.index(tensor.dtype), len(raw)))
        out.append(raw)
    out.append(struct.pack("<I", len(aliases or {})))
    for alias, target in (aliases or {}).items():
        out.append(_string(alias) + _string(target))
    return b"".join(out)


def write_parts(data: bytes, directory: Path, cuts: list[int]) -> list[Path]:
    """Split `data` at byte offsets `cuts` into numbered part files."""
    bounds = [0, *cuts, len(data)]
    parts = []
    for index, (start, end) in enumerate(itertools.pairwise(bounds)):
        part = directory / f"model.bin.part{index}"
        part.write_bytes(data[start:end])
        parts.append(part)
    return parts
