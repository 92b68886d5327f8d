"""The demultiplexer of interleaved audio (session/channels.py), without sockets."""

from __future__ import annotations

import numpy as np
import pytest

from session.channels import mix_down, split_channels
from wire.codes import CloseCode, Encoding
from wire.errors import ProtocolError


def interleave(*channels: np.ndarray) -> bytes:
    return np.stack(channels, axis=1).tobytes()


def test_split_gives_each_channel_its_own_samples_in_order() -> None:
    """Three interleaved s16 channels come apart sample for sample, in channel order."""
    a = np.arange(0, 100, dtype="<i2")
    b = np.arange(1000, 1100, dtype="<i2")
    c = -np.arange(0, 100, dtype="<i2")
    frames = split_channels(interleave(a, b, c), 3, Encoding.PCM_S16LE)
    assert [np.frombuffer(f, "<i2").tolist() for f in frames] == [
        a.tolist(),
        b.tolist(),
        c.tolist(),
    ]


def test_split_keeps_whole_float_samples() -> None:
    """pcm_f32le: 4-byte samples are moved whole (a wrong width would scramble them)."""
    left = np.linspace(-1, 1, 64, dtype="<f4")
    right = np.linspace(1, -1, 64, dtype="<f4")
    first, second = split_channels(interleave(left, right), 2, Encoding.PCM_F32LE)
    assert np.array_equal(np.frombuffer(first, "<f4"), left)
    assert np.array_equal(np.frombuffer(second, "<f4"), right)


def test_one_channel_passes_through() -> None:
    """channels=1: the frame is the channel."""
    frame = bytes(range(10))
    assert split_channels(frame, 1, Encoding.PCM_S16LE) == [frame]
    assert mix_down(frame, 1, Encoding.PCM_S16LE) == frame


@pytest.mark.parametrize(("size", "channels"), [(6, 2), (2, 2), (12, 8)])
def test_a_frame_of_partial_sample_frames_is_refused_1007(size: int, channels: int) -> None:
    """A frame that does not hold one sample of every channel a whole number of times is
    invalid audio (1007), as an odd-length mono s16 frame is."""
    with pytest.raises(ProtocolError) as refused:
        split_channels(bytes(size), channels, Encoding.PCM_S16LE)
    assert refused.value.close_code == CloseCode.INVALID_PAYLOAD
    with pytest.raises(ProtocolError):
        mix_down(bytes(size), channels, Encoding.PCM_S16LE)


def test_mix_down_is_the_mean_of_the_channels() -> None:
    """Mono is the mean at each instant, rounded, without overflow at full scale."""
    left = np.array([100, -32768, 32767, 3], dtype="<i2")
    right = np.array([300, -32768, 32767, 0], dtype="<i2")
    mono = np.frombuffer(mix_down(interleave(left, right), 2, Encoding.PCM_S16LE), "<i2")
    assert mono.tolist() == [200, -32768, 32767, 2]
    floats = mix_down(
        interleave(np.array([0.5, 1], "<f4"), np.array([-0.5, 0], "<f4")), 2, Encoding.PCM_F32LE
    )
    assert np.frombuffer(floats, "<f4").tolist() == [0.0, 0.5]
