"""Whisper's encoder over windows shorter than 30 s, all sharing one set of weights.

Whisper pads every input to a 30 s window, and on short utterances the encoder then spends
most of its time on padding. The encoder is a plain transformer over 1500 positions with a
learned table of position embeddings, so a shorter window is the same network with the
table cut to the first N rows: attention and the convolutions do not care about length.

transformers' `WhisperEncoder.forward` refuses inputs other than
`2 * config.max_source_positions` mel frames and adds the whole position table, so each
window gets its own `WhisperEncoder` built for a config with a smaller
`max_source_positions`. It is built on the meta device (no memory, no init) and then given
the full encoder's own submodules (convolutions, layers, final norm) and a position table
that is a view of the full one's first N rows: every weight is the same memory as the
model's, and layers swapped for int8 ones (`engine.whisper.int8`) before the windows are built are
shared too. The alternatives were worse: mutating `config.max_source_positions` per call
races with any other reader of the shared config, and re-implementing `forward` would fork
transformers' attention code paths (SDPA, flash, fp16 clamping) that this way stay theirs.
Build the windows after the model has its final device, dtype and layers.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from transformers.models.whisper.modeling_whisper import WhisperEncoder

from engine.api import SAMPLE_RATE

HOP_LENGTH = 160  # samples per mel frame (10 ms)
FRAMES_PER_SECOND = SAMPLE_RATE // HOP_LENGTH


class WindowedEncoders:
    """One encoder per window length; `for_duration` picks the smallest that fits."""

    def __init__(self, encoder: WhisperEncoder, windows: Sequence[float]) -> None:
        stride = int(encoder.conv1.stride[0]) * int(encoder.conv2.stride[0])
        full_positions = int(encoder.config.max_source_positions)
        self.full_window = full_positions * stride / FRAMES_PER_SECOND
        self._frames_per_position = stride
        self._encoders: dict[float, WhisperEncoder] = {}
        for window in sorted(set(windows)):
            frames = window * FRAMES_PER_SECOND
            if window <= 0 or window > self.full_window or frames != int(frames):
                raise ValueError(
                    f"window {window} s must be in (0, {self.full_window}] and a whole number "
                    "of 10 ms frames"
                )
            if int(frames) % stride:
                raise ValueError(f"window {window} s is not a multiple of {stride} mel frames")
            if window < self.full_window:
                self._encoders[window] = _sliced(encoder, int(frames) // stride)
        self._encoders[self.full_window] = encoder

    @property
    def windows(self) -> tuple[float, ...]:
        """Window lengths in seconds, ascending; the last is the model's full window."""
        return tuple(self._encoders)

    def encoder(self, window: float) -> WhisperEncoder:
        """The encoder of `window` s (a view of the full one's weights below the full window)."""
        return self._encoders[window]

    def for_duration(self, seconds: float, among: Sequence[float] | None = None) -> float:
        """The smallest window holding `seconds` of audio (the full window if none does),
        of all windows or only those `among` (each one of them)."""
        for window in self._encoders if among is None else sorted(among):
            if window not in self._encoders:
                raise ValueError(f"no encoder for a {window} s window")
            if seconds <= window:
                return window
        return self.full_window

    def frames(self, window: float) -> int:
        return round(window * FRAMES_PER_SECOND)

    def encode(self, window: float, features: torch.Tensor) -> torch.Tensor:
        """Encoder hidden states, (batch, frames / 2, d_model), for features of `window` s,
        in the features' dtype (the encoder may run in another: its weights')."""
        dtype = self._encoders[window].conv1.weight.dtype
        hidden: torch.Tensor = self._encoders[window](features.to(dtype)).last_hidden_state
        return hidden.to(features.dtype)


def _sliced(encoder: WhisperEncoder, positions: int) -> WhisperEncoder:
    config = copy.deepcopy(encoder.config)
    config.max_source_positions = positions
    with torch.device("meta"):
        windowed = WhisperEncoder(config)
    for name, child in encoder.named_children():
        if name != "embed_positions":
            setattr(windowed, name, child)
    table = encoder.embed_positions.weight[:positions]
    windowed.embed_positions = torch.nn.Embedding.from_pretrained(  # type: ignore[no-untyped-call]
        table, freeze=True
    )
    if any(t.is_meta for t in (*windowed.parameters(), *windowed.buffers())):
        raise RuntimeError("a windowed encoder kept a tensor the full encoder does not share")
    windowed.requires_grad_(False)
    torch.nn.Module.eval(windowed)
    return windowed
