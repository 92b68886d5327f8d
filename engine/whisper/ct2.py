"""Reader for CTranslate2's `model.bin`, the binary format faster-whisper models ship in.

The layout (CTranslate2 `python/ctranslate2/specs/model_spec.py` `ModelSpec._serialize`,
read back by `src/models/model.cc` `Model::load`), all integers little-endian:

    u32 binary_version                       (4 to 6 are read here)
    str spec_name, u32 spec_revision          (e.g. "WhisperSpec", 3)
    u32 variable_count
    variable_count times:
        str name, u8 rank, rank * u32 dims, u8 dtype_id, u32 byte_count, bytes
    u32 alias_count
    alias_count times: str alias, str target  (alias → the name of a stored variable)

where `str` is a u16 byte length (counting a trailing NUL), then the UTF-8 bytes and the
NUL. dtype ids follow CTranslate2's `DataType` enum: float32, int8, int16, int32, float16,
bfloat16. A model may be shipped split into parts that concatenate to one `model.bin`;
`read_model` takes the parts in order and never joins them on disk or in memory.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import torch

SUPPORTED_BINARY_VERSIONS = range(4, 7)

DTYPES: tuple[torch.dtype, ...] = (
    torch.float32,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.float16,
    torch.bfloat16,
)


class Ct2FormatError(ValueError):
    """The bytes are not a CTranslate2 model this reader understands."""


@dataclass(frozen=True, slots=True)
class Ct2Model:
    """Every variable of a CTranslate2 model, by its scoped name (`encoder/layer_0/...`)."""

    spec: str
    revision: int
    variables: dict[str, torch.Tensor]
    aliases: dict[str, str]

    def scalar(self, name: str) -> int:
        """An integer scalar variable, such as `decoder/num_heads`."""
        value = self.variables[name]
        if value.dim() != 0:
            raise Ct2FormatError(f"{name} has shape {tuple(value.shape)}, expected a scalar")
        return int(value.item())

    def resolve(self, name: str) -> torch.Tensor:
        """A variable, following an alias if `name` is one."""
        return self.variables[self.aliases.get(name, name)]


class _Parts:
    """Reads a sequence of files as one stream, in order."""

    def __init__(self, files: Sequence[BinaryIO]) -> None:
        self._files: Iterator[BinaryIO] = iter(files)
        self._current: BinaryIO | None = next(self._files, None)

    def read(self, size: int) -> bytes:
        chunks: list[bytes] = []
        while size > 0 and self._current is not None:
            chunk = self._current.read(size)
            if chunk:
                chunks.append(chunk)
                size -= len(chunk)
            else:
                self._current = next(self._files, None)
        return b"".join(chunks)

    def exact(self, size: int) -> bytes:
        data = self.read(size)
        if len(data) != size:
            raise Ct2FormatError(f"truncated model: wanted {size} bytes, got {len(data)}")
        return data

    def unpack(self, fmt: str) -> int:
        value: int = struct.unpack("<" + fmt, self.exact(struct.calcsize(fmt)))[0]
        return value

    def string(self) -> str:
        raw = self.exact(self.unpack("H"))
        if not raw.endswith(b"\0"):
            raise Ct2FormatError(f"string {raw[:40]!r} is not NUL-terminated")
        return raw[:-1].decode("utf-8")

    def at_end(self) -> bool:
        return self.read(1) == b""


def _read_variable(stream: _Parts) -> tuple[str, torch.Tensor]:
    name = stream.string()
    rank = stream.unpack("B")
    shape = [stream.unpack("I") for _ in range(rank)]
    dtype_id = stream.unpack("B")
    if dtype_id >= len(DTYPES):
        raise Ct2FormatError(f"{name}: unknown dtype id {dtype_id}")
    dtype = DTYPES[dtype_id]
    byte_count = stream.unpack("I")
    expected = dtype.itemsize
    for dim in shape:
        expected *= dim
    if byte_count != expected:
        raise Ct2FormatError(f"{name}: {byte_count} bytes for shape {shape} of {dtype}")
    data = bytearray(stream.exact(byte_count))
    tensor = torch.frombuffer(data, dtype=dtype) if byte_count else torch.empty(0, dtype=dtype)
    return name, tensor.reshape(shape)


def read_model(parts: Sequence[Path]) -> Ct2Model:
    """Parse a `model.bin` given as one file or as parts to concatenate, in order."""
    if not parts:
        raise ValueError("no model.bin parts given")
    with ExitStack() as stack:
        stream = _Parts([stack.enter_context(path.open("rb")) for path in parts])
        version = stream.unpack("I")
        if version not in SUPPORTED_BINARY_VERSIONS:
            raise Ct2FormatError(
                f"binary version {version} is not supported (only "
                f"{SUPPORTED_BINARY_VERSIONS.start}..{SUPPORTED_BINARY_VERSIONS.stop - 1})"
            )
        spec = stream.string()
        revision = stream.unpack("I")
        variables = dict(_read_variable(stream) for _ in range(stream.unpack("I")))
        aliases = {}
        for _ in range(stream.unpack("I")):
            alias = stream.string()
            aliases[alias] = stream.string()
        if not stream.at_end():
            raise Ct2FormatError("trailing bytes after the alias table")
    for alias, target in aliases.items():
        if target not in variables:
            raise Ct2FormatError(f"alias {alias} points to unknown variable {target}")
    return Ct2Model(spec=spec, revision=revision, variables=variables, aliases=aliases)
