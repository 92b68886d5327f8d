"""How to run the Whisper recognizer: `WhisperRecognizerConfig` and its vocabularies."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engine.choices import QUANTIZE_SCOPES, DType, Quantize
from engine.whisper import keyterms
from engine.whisper.guard import GuardConfig
from engine.whisper.int8 import int8_available

# The linear layers each scope replaces by `Int8Linear`s (int8-shortlist: none; it keeps an
# int8 copy of the projection beside the float32 one).
INT8_LAYERS: dict[str, Callable[[str], bool]] = {
    "int8-decoder": lambda name: name == "proj_out" or name.startswith("model.decoder."),
    "int8": lambda name: True,
}
_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}
ENGLISH = "en"


@dataclass(frozen=True, slots=True)
class WhisperRecognizerConfig:
    """How to run the model. `dtype=None` means float32 on CPU, float16 on CUDA.

    `windows` are the encoder window buckets in seconds; the model's full window (30 s) is
    always added. Give `(30.0,)` to pad everything to 30 s as stock Whisper does. A batch
    gets the smallest window holding its longest utterance plus `window_margin` seconds.
    `max_tokens_per_second` bounds each utterance's decoding at that many tokens per second
    of its audio (plus a few; at most half the decoder's context, Whisper's own limit), so
    a looping utterance stops early and does not hold up the rest of its batch.
    `retry_loops_on_full_window` decodes looping utterances again on the full window.
    `prompt_tokens` bounds each utterance's `prompt` (the previous text, Whisper's
    `<|startofprev|>` prefix) to its last that many tokens; 0 ignores prompts (keyterms
    in the prompt have a room of their own: `engine.whisper.keyterms.PROMPT_TOKENS`).
    `quantize` stores some linear layers' weights as int8 and multiplies in integers, with
    activations quantized per row (`engine.whisper.int8`; CPU and float32 only):
    `int8-shortlist` only to shortlist each step's candidate tokens, rescored in float32
    (float32's tokens, `engine.whisper.vocabulary`), `int8-decoder` the decoder's layers and
    its vocabulary projection, `int8` the encoder's as well (what each saves, and its
    accuracy: docs/performance.md#the-models-arithmetic). `drafts` lets each utterance's
    `draft` seed its decoding (`engine.whisper.greedy`); off, drafts are ignored.
    `word_timings` computes the words of the utterances that ask for them
    (`engine.whisper.alignment`); off, every transcription's `words` is empty.
    Partials (`Utterance.partial`) are decoded more cheaply: a partial's window is the
    smallest of `windows` and `partial_windows` holding its audio plus `partial_margin`,
    its budget `partial_tokens_per_second` tokens per second of audio (plus a few), and a
    partial that loops is not decoded again on the full window: it keeps the first cycle
    of what it repeats, or gives empty text (loops, words and cost per grid:
    docs/history/2026-12-02-partials-and-bfloat16.md#cheaper-partials-issue-15).
    `partial_quantize` decodes batches of partials only through cheaper weights than finals:
    `int8-decoder` gives them the decoder's layers and vocabulary projection in int8 (copies
    beside the finals' weights), cheaper on the CPU, where a decoder step is bound by
    reading its weights; a partial is shown for a moment and is only a draft to its final,
    whose text does not depend on it (docs/performance.md#the-models-arithmetic). None (or
    where finals' decoder is int8 already): the same weights as finals.
    `encoder_dtype` runs the encoder in another dtype than the rest (None: `dtype`):
    bfloat16 halves a CPU encoder pass where the CPU multiplies bfloat16 natively
    (`engine.loading.resolve_encoder_dtype`; docs/performance.md#the-models-arithmetic);
    its states go to the decoder in `dtype`.
    `context_window` is the longest window an utterance's left context may fill (with
    the margin): the context's oldest utterances are dropped until it fits
    (`engine.whisper.context.fitted`); an utterance that needs a longer window alone gets none.
    `context_own_window` keeps every context inside the window its utterance has alone
    (`context_window` then unused): it fills the room the utterance leaves there, its
    text's last words that fit (`engine.whisper.context.filled`), so the encoder's window and
    cost are the utterance's own; a row that loops behind such a context is decoded
    again without it in the same window (the redo), not on the full window (a short
    final with its window filled loops more often, and the full window costs 3-4x).
    Keyterms (`Utterance.keyterms`, `engine.whisper.keyterms`): `keyterm_prompt` puts them in the
    prompt; `keyterm_start` and `keyterm_continue` are the logit bonuses on beginning and
    on continuing one (0 and 0: no boosting; docs/performance.md#keyterms); `keyterm_rewrite`
    writes a term after decoding where unsure words sound like it (`engine.whisper.soundalike`).
    `decoder_graphs` runs the decoder's single-token steps over fixed buffers, replayed
    from CUDA graphs on a GPU (`engine.whisper.step_graphs`; on a CPU eagerly, for tests).
    """

    device: str = "cpu"
    dtype: DType | None = None
    encoder_dtype: DType | None = None
    windows: tuple[float, ...] = (10.0, 15.0, 20.0, 30.0)
    window_margin: float = 1.0
    max_batch_size: int | None = None  # a direct caller's bound on one forward pass
    max_tokens_per_second: float = 8.0
    retry_loops_on_full_window: bool = True
    quantize: Quantize = "none"
    drafts: bool = True
    prompt_tokens: int = 128
    word_timings: bool = True
    partial_windows: tuple[float, ...] = (4.0, 6.0, 8.0)
    partial_margin: float = 2.0
    partial_tokens_per_second: float = 5.0
    partial_quantize: Quantize | None = None
    context_window: float = 20.0
    context_own_window: bool = False
    keyterm_prompt: bool = True
    keyterm_start: float = keyterms.START
    keyterm_continue: float = keyterms.CONTINUE
    keyterm_rewrite: bool = True
    guard: GuardConfig = field(default_factory=GuardConfig)
    decoder_graphs: bool = False

    def __post_init__(self) -> None:
        if self.max_batch_size is not None and self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_tokens_per_second <= 0 or self.partial_tokens_per_second <= 0:
            raise ValueError("max_tokens_per_second and partial_tokens_per_second must be > 0")
        if not self.windows:
            raise ValueError("windows must name at least one window length")
        if self.prompt_tokens < 0:
            raise ValueError(f"prompt_tokens must be >= 0, got {self.prompt_tokens}")
        if self.context_window <= 0:
            raise ValueError(f"context_window must be > 0, got {self.context_window}")
        if self.window_margin < 0 or self.partial_margin < 0:
            raise ValueError("window_margin and partial_margin must be >= 0")
        device = torch.device(self.device)  # raises on a malformed device string
        if self.quantize not in QUANTIZE_SCOPES:
            raise ValueError(f"quantize must be one of {', '.join(QUANTIZE_SCOPES)}")
        if self.quantize != "none":
            if device.type != "cpu" or self.torch_dtype != torch.float32:
                raise ValueError("int8 runs on the CPU in float32 only")
            if not int8_available():
                raise ValueError("this torch build has no fbgemm/x86 kernels for int8")
        if self.partial_quantize not in (None, self.quantize, "int8-decoder"):
            raise ValueError("partial_quantize must be None, quantize's scope or int8-decoder")
        if self.int8_partials and (
            device.type != "cpu" or self.torch_dtype != torch.float32 or not int8_available()
        ):
            raise ValueError("int8 partials run on the CPU in float32 only, with fbgemm")
        if self.quantize == "int8" and self.encoder_torch_dtype != torch.float32:
            raise ValueError("quantize int8 quantizes the encoder: its dtype must be float32")

    @property
    def int8_partials(self) -> bool:
        """Whether partials decode through int8 copies of float32 decoder weights."""
        cheaper = self.quantize in ("none", "int8-shortlist")
        return cheaper and self.partial_quantize == "int8-decoder"

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype is not None:
            return _DTYPES[self.dtype]
        return torch.float16 if torch.device(self.device).type == "cuda" else torch.float32

    @property
    def encoder_torch_dtype(self) -> torch.dtype:
        return self.torch_dtype if self.encoder_dtype is None else _DTYPES[self.encoder_dtype]
