"""Binary audio frames → float32 samples at 16 kHz.

Frames may have any size. `pcm_s16le` frames must hold whole samples; `pcm_f32le`
samples must be finite. Other sample rates go through a streaming soxr resampler, so
frame boundaries leave no clicks and the stream's sample count stays exact over time.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import soxr

from engine.api import SAMPLE_RATE
from wire.codes import DEFAULT_SAMPLE_RATE, CloseCode, Encoding, ErrorCode
from wire.errors import ProtocolError

# A stream that names no rate is at the model's: it goes through without resampling.
assert DEFAULT_SAMPLE_RATE == SAMPLE_RATE, "the protocol's default rate is the model's"

FloatArray = npt.NDArray[np.float32]


class FrameDecoder:
    def __init__(self, encoding: Encoding, sample_rate: int) -> None:
        self._encoding = encoding
        self._resampler = (
            None
            if sample_rate == SAMPLE_RATE
            else soxr.ResampleStream(sample_rate, SAMPLE_RATE, 1, dtype="float32", quality="HQ")
        )

    def decode(self, frame: bytes) -> FloatArray:
        """One binary frame → samples at 16 kHz (possibly none, while the resampler fills)."""
        width = self._encoding.sample_width
        if len(frame) % width:
            raise ProtocolError(
                ErrorCode.INVALID_AUDIO,
                CloseCode.INVALID_PAYLOAD,
                f"{self._encoding.value} frame of {len(frame)} bytes is not a whole number "
                f"of {width}-byte samples",
            )
        if self._encoding is Encoding.PCM_S16LE:
            samples = np.frombuffer(frame, dtype="<i2").astype(np.float32) / 32768.0
        else:
            samples = np.frombuffer(frame, dtype="<f4").astype(np.float32)
            if not np.isfinite(samples).all():
                raise ProtocolError(
                    ErrorCode.INVALID_AUDIO,
                    CloseCode.INVALID_PAYLOAD,
                    "pcm_f32le frame contains NaN or infinite samples",
                )
            np.clip(samples, -1.0, 1.0, out=samples)
        if self._resampler is None:
            return samples
        resampled: FloatArray = self._resampler.resample_chunk(samples)
        return resampled

    def flush(self) -> FloatArray:
        """Samples still inside the resampler at the end of the stream."""
        if self._resampler is None:
            return np.zeros(0, np.float32)
        tail: FloatArray = self._resampler.resample_chunk(np.zeros(0, np.float32), last=True)
        return tail
