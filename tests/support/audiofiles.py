"""Audio files for the upload tests, made with PyAV at set-up: good ones and hostile ones."""

from __future__ import annotations

import io
import struct
import zlib
from typing import cast

import av
import numpy as np
import numpy.typing as npt
from av.audio.stream import AudioStream

# name → (FFmpeg muxer, encoder, encoder rate, bit rate)
FORMATS: dict[str, tuple[str, str, int, int | None]] = {
    "wav": ("wav", "pcm_s16le", 16_000, None),
    "mp3": ("mp3", "libmp3lame", 16_000, 64_000),
    "m4a": ("ipod", "aac", 16_000, 64_000),
    "flac": ("flac", "flac", 16_000, None),
    "ogg": ("ogg", "libopus", 48_000, 32_000),
}


def encode(
    samples: npt.NDArray[np.float32], name: str, rate: int = 16_000, codec_rate: int | None = None
) -> bytes:
    """Encode mono float samples at `rate` into one of FORMATS (encoded at its usual rate,
    or `codec_rate`), in memory."""
    muxer, codec, usual_rate, bit_rate = FORMATS[name]
    codec_rate = codec_rate or usual_rate
    buffer = io.BytesIO()
    with av.open(buffer, "w", format=muxer) as container:
        stream = cast(AudioStream, container.add_stream(codec, rate=codec_rate, layout="mono"))
        if bit_rate:
            stream.bit_rate = bit_rate
        pcm = (np.clip(samples, -1, 1) * 32767).astype(np.int16)[None, :]
        frame = av.AudioFrame.from_ndarray(pcm, format="s16", layout="mono")
        frame.sample_rate = rate
        resampler = av.AudioResampler(
            format=stream.codec_context.format, layout="mono", rate=codec_rate
        )
        for resampled in [*resampler.resample(frame), *resampler.resample(None)]:
            container.mux(stream.encode(resampled))
        container.mux(stream.encode(None))
    return buffer.getvalue()


def wav_header(rate: int, data_bytes: int) -> bytes:
    """A 16-bit mono PCM WAV header declaring `data_bytes` of samples."""
    riff = (36 + data_bytes) & 0xFFFFFFFF
    return (
        b"RIFF"
        + struct.pack("<I", riff)
        + b"WAVEfmt "
        + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
        + b"data"
        + struct.pack("<I", data_bytes & 0xFFFFFFFF)
    )


def one_hertz_wav(seconds: int) -> bytes:
    """A tiny WAV (2 bytes a second) that declares, and decodes to, hours of silence."""
    return wav_header(1, seconds * 2) + bytes(seconds * 2)


def unknown_length_wav(rate: int, seconds: float) -> bytes:
    """A WAV whose size field says 'unknown' (as streaming recorders write): its length
    is only known by decoding it."""
    data = bytes(int(rate * seconds) * 2)
    return wav_header(rate, 0xFFFFFFFF) + data


def ffconcat(target: str = "/etc/passwd") -> bytes:
    return f"ffconcat version 1.0\nfile '{target}'\nfile 'http://127.0.0.1:9/x.wav'\n".encode()


def m3u8() -> bytes:
    return (
        b"#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:10,\n"
        b"http://127.0.0.1:9/segment.ts\n#EXT-X-ENDLIST\n"
    )


def png() -> bytes:
    """A valid 1×1 grey PNG."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\x00\x80"))
        + chunk(b"IEND", b"")
    )


def random_bytes(size: int, seed: int = 7) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()
