"""Interleaved multichannel audio: split into one sample stream per channel, or mixed down.

Sans-I/O and stateless: a frame in, bytes out. A multichannel frame must hold whole
sample frames (one sample of every channel), as a mono `pcm_s16le` frame must hold whole
samples; anything else is refused 1007 (`invalid_audio`). Live streams (server/sockets/channels.py)
and uploads (session/file_transcriber.py) split through the same function.
"""

from __future__ import annotations

import numpy as np

from wire.codes import CloseCode, Encoding, ErrorCode
from wire.errors import ProtocolError


def _check(frame: bytes, channels: int, encoding: Encoding) -> int:
    """The frame's sample frames; ProtocolError (1007) unless it holds whole ones."""
    if channels < 1:
        raise ValueError(f"channels must be at least 1, not {channels}")
    stride = channels * encoding.sample_width
    if len(frame) % stride:
        raise ProtocolError(
            ErrorCode.INVALID_AUDIO,
            CloseCode.INVALID_PAYLOAD,
            f"{encoding.value} frame of {len(frame)} bytes is not a whole number of "
            f"{channels}-channel samples ({stride} bytes each)",
        )
    return len(frame) // stride


def split_channels(frame: bytes, channels: int, encoding: Encoding) -> list[bytes]:
    """One interleaved frame → one frame per channel, in channel order (each mono, in the
    same encoding and sample rate)."""
    frames = _check(frame, channels, encoding)
    if channels == 1:
        return [frame]
    width = encoding.sample_width
    grid = np.frombuffer(frame, dtype=np.uint8).reshape(frames, channels, width)
    return [grid[:, c, :].tobytes() for c in range(channels)]


def mix_down(frame: bytes, channels: int, encoding: Encoding) -> bytes:
    """One interleaved frame → mono: the mean of its channels at each instant."""
    frames = _check(frame, channels, encoding)
    if channels == 1:
        return frame
    if encoding is Encoding.PCM_S16LE:
        grid = np.frombuffer(frame, dtype="<i2").reshape(frames, channels).astype(np.int32)
        mean = np.round(grid.sum(axis=1) / channels)
        return bytes(np.clip(mean, -32768, 32767).astype("<i2").tobytes())
    floats = np.frombuffer(frame, dtype="<f4").reshape(frames, channels)
    return bytes(floats.mean(axis=1, dtype=np.float64).astype("<f4").tobytes())
