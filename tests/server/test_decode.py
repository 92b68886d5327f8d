"""The upload decoder: a sandboxed PyAV subprocess (bubblewrap), fed good and hostile files."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from server.uploads.decode import DecodeLimits, decode_file
from server.uploads.decode_worker import Refusal
from server.uploads.sandbox import SandboxMode, open_sandbox
from tests.support import audiofiles
from tests.support.corpus import clip

LIMITS = DecodeLimits(max_seconds=3600, cpu_seconds=30, memory_bytes=512 << 20, wall_seconds=30)


@pytest.fixture(scope="module")
def jfk() -> dict[str, bytes]:
    """The JFK clip in each accepted format, encoded at set-up."""
    samples = clip("en_jfk").samples()
    return {name: audiofiles.encode(samples, name) for name in audiofiles.FORMATS}


async def decode_bytes(tmp_path: Path, data: bytes, limits: DecodeLimits = LIMITS) -> Any:
    src = tmp_path / "in"
    src.write_bytes(data)
    # As the server runs it: in the sandbox (bubblewrap must be installed, as in CI).
    return await decode_file(src, tmp_path / "out.s16", limits, open_sandbox(SandboxMode.BWRAP))


@pytest.mark.parametrize("name", list(audiofiles.FORMATS))
async def test_decoder_turns_each_format_into_16k_mono(
    tmp_path: Path, jfk: dict[str, bytes], name: str
) -> None:
    """wav, mp3, m4a, flac and ogg/opus decode to 11 s of 16 kHz s16 close to the source."""
    audio = await decode_bytes(tmp_path, jfk[name])
    assert abs(audio.seconds - 11.0) < 0.1, audio
    pcm = np.frombuffer(audio.path.read_bytes(), "<i2").astype(np.float32) / 32768
    assert len(pcm) == audio.samples
    source = clip("en_jfk").samples()
    n = min(len(pcm), len(source))
    # Lossy codecs delay and smear the signal; its loudness must survive.
    assert abs(np.sqrt(np.mean(pcm[:n] ** 2)) / np.sqrt(np.mean(source[:n] ** 2)) - 1) < 0.15


HOSTILE: list[tuple[str, bytes, int, str]] = [
    ("ffconcat playlist", audiofiles.ffconcat(), 415, "unsupported_format"),
    ("hls playlist", audiofiles.m3u8(), 415, "unsupported_format"),
    ("png image", audiofiles.png(), 415, "unsupported_format"),
    ("random bytes", audiofiles.random_bytes(20_000), 415, "unsupported_format"),
    ("empty file", b"", 415, "unsupported_format"),
    ("1 Hz wav declaring 5 h", audiofiles.one_hertz_wav(5 * 3600), 422, "audio_too_long"),
    ("wav of unknown length, 1 Hz", audiofiles.unknown_length_wav(1, 100), 422, "invalid_audio"),
]


@pytest.mark.parametrize(("name", "data", "status", "code"), HOSTILE, ids=[h[0] for h in HOSTILE])
async def test_decoder_refuses_hostile_files(
    tmp_path: Path, name: str, data: bytes, status: int, code: str
) -> None:
    """Playlists, images, noise and absurd headers are refused with a status and reason."""
    with pytest.raises(Refusal) as caught:
        await decode_bytes(tmp_path, data)
    assert (caught.value.status, caught.value.code) == (status, code), caught.value.message
    assert caught.value.message


@pytest.mark.parametrize("name", ["wav", "mp3", "m4a", "flac"])
async def test_decoder_refuses_truncated_files(
    tmp_path: Path, jfk: dict[str, bytes], name: str
) -> None:
    """A file cut in half is refused as damaged (422), never transcribed in part."""
    data = jfk[name]
    with pytest.raises(Refusal) as caught:
        await decode_bytes(tmp_path, data[: len(data) // 2 + 1])
    assert caught.value.status == 422 and caught.value.code == "invalid_audio"
    assert "truncated" in caught.value.message or "damaged" in caught.value.message


async def test_decoder_counts_duration_it_cannot_read_from_the_header(tmp_path: Path) -> None:
    """A WAV of unknown length is decoded and stopped as soon as it passes the cap."""
    limits = DecodeLimits(max_seconds=5, cpu_seconds=30, memory_bytes=512 << 20, wall_seconds=30)
    with pytest.raises(Refusal) as caught:
        await decode_bytes(tmp_path, audiofiles.unknown_length_wav(8000, 20), limits)
    assert caught.value.code == "audio_too_long"
    assert "decodes to more than 5 s" in caught.value.message


async def test_decoder_wall_clock_limit_kills_it(tmp_path: Path, jfk: dict[str, bytes]) -> None:
    """A decoder over its wall-clock limit is killed and the upload refused (422)."""
    limits = DecodeLimits(max_seconds=60, cpu_seconds=30, memory_bytes=512 << 20, wall_seconds=0.01)
    with pytest.raises(Refusal) as caught:
        await decode_bytes(tmp_path, jfk["wav"], limits)
    assert (caught.value.status, caught.value.code) == (422, "decode_limit")


async def test_decoder_refuses_garbled_files(tmp_path: Path, jfk: dict[str, bytes]) -> None:
    """An MP3 with 2 % of its bytes overwritten is refused: too many damaged packets."""
    data = np.frombuffer(jfk["mp3"], np.uint8).copy()
    rng = np.random.default_rng(1)
    spots = rng.integers(1000, len(data), len(data) // 50)
    data[spots] = rng.integers(0, 256, len(spots), dtype=np.uint8)
    with pytest.raises(Refusal) as caught:
        await decode_bytes(tmp_path, data.tobytes())
    assert caught.value.status == 422 and "damaged" in caught.value.message


async def test_decoder_follows_a_rate_change_midway(tmp_path: Path) -> None:
    """Two MP3s at 16 and 44.1 kHz joined end to end decode to their summed length."""
    samples = clip("en_jfk").samples()
    joined = audiofiles.encode(samples, "mp3") + audiofiles.encode(
        samples, "mp3", codec_rate=44_100
    )
    audio = await decode_bytes(tmp_path, joined)
    assert abs(audio.seconds - 22.0) < 0.2, audio


async def test_decoder_that_cannot_start_is_a_server_error(
    tmp_path: Path, jfk: dict[str, bytes]
) -> None:
    """Limits too tight for the decoder to even start are the server's fault: 500."""
    limits = DecodeLimits(max_seconds=60, cpu_seconds=30, memory_bytes=48 << 20, wall_seconds=30)
    with pytest.raises(Refusal) as caught:
        await decode_bytes(tmp_path, jfk["wav"], limits)
    assert (caught.value.status, caught.value.code) == (500, "internal")
