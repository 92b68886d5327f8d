"""Batched Whisper on torch + transformers: the `Recognizer` the scheduler drives.

One batch runs in three phases. Preprocess (CPU): log-mel features, padded to the
smallest encoder window (`engine.windows`) that holds the batch's longest utterance plus
a margin. Forward: the windowed encoder, then greedy decoding (`engine.greedy`, a lean
decoder step over the model's own layers, several times cheaper per step than
transformers' `generate()` on CPU): one decoder step at <|startoftranscript|> (no-speech
probability, and the language where a multilingual model must detect it), then the rest
of each row's prompt and the greedy tokens. Postprocess (CPU): decode, average
log-probability, hallucination guard (`engine.guard`).

Languages: each utterance either pins its language (`Utterance.language`) or leaves it to
be detected. Detection reads the language tokens' logits off the decoder step that
computes the no-speech probability anyway, as Whisper's own `detect_language` does, so it
needs no extra encoder pass; it is computed only for the rows that ask for it. Each row's
prompt then carries its own language token, so a batch mixes sources of different
languages freely.

A short window saves most of the encoder's work, but tiny.en loops ("Go forward 10
meters. Go forward 10 meters. ...") when the window leaves little silence after the
speech: on the corpus, 5 s windows looped on 3 of 6 clips under 3.5 s, and windows of
10 s or more with 1 s to spare looped once in 27 clips. So the default windows start at
10 s, and utterances whose decoding still loops, while the model takes them for speech,
are decoded once more, together, on the full 30 s window (like Whisper's temperature
fallback, but changing the window): one `generate()` per batch, a second one only for
those.

Partials (`Utterance.partial`) are shown for a moment and replaced, so they trade a few
loops for cost: a partial's window is the smallest of `partial_windows` (4/6/8 s) and the
finals' windows that holds its audio plus `partial_margin` (2 s), its token budget is
`partial_tokens_per_second` (5) per second of audio plus a few (speech is ~3-4), and a
partial is never decoded a second time on the full window. In a short window tiny.en
often reads the speech and then reads it again into the padding; a partial keeps the
first reading (`_cut_repeats`). On live partials' audio that cut the encoder's window
from 10 s to ~6 s on average, with 6 of 170 partials empty (4 in the 10 s window)
(docs/performance.md, "Cheaper partials").

Prompts: an utterance's `prompt` (its source's previous text) is read before
<|startoftranscript|> after <|startofprev|>, its last `prompt_tokens` tokens, as Whisper
conditions on previous text; the no-speech probability is read after it, as Whisper's.
Rows with and without prompts share a batch (`engine.greedy` keeps each row's attention
on its own tokens). Whisper's encoder never masks padding (it was trained on zero-padded
windows).
Left context (`Utterance.left`, `engine.context`): the audio said before an utterance goes
in the window ahead of it and that audio's text is forced after <|notimestamps|>, so the
model writes on from there (rows' forced texts differ in length: `engine.greedy`).
Word timings (`engine.alignment`) are computed for the utterances that ask for them
(`Utterance.word_timings`: finals, not partials), once their decoding is kept: one more
decoder pass over those rows' tokens (without the prompt, as Whisper aligns), reusing the
greedy decoder's encoder keys and values.

The recognizer never sets torch's thread count; the process that owns it decides.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from transformers import (
    GenerationConfig,
    WhisperFeatureExtractor,
    WhisperForConditionalGeneration,
    WhisperTokenizer,
)

from engine import context
from engine.alignment import Aligner, AlignmentRequest
from engine.api import SAMPLE_RATE, Transcription, Utterance, WordTiming
from engine.decoding import read_row, token_budget
from engine.first_step import FirstRead, FirstStep
from engine.greedy import Greedy, GreedyDecoder, Started
from engine.guard import Verdict, first_cycle, judge, looped
from engine.int8 import Int8Linear, quantize_linears
from engine.recognizer import Interrupted, StopCheck
from engine.vocabulary import FullHead, ShortlistHead, VocabularyHead
from engine.whisper_config import (
    ENGLISH,
    INT8_LAYERS,
    DType,
    Quantize,
    WhisperRecognizerConfig,
)
from engine.windows import WindowedEncoders

__all__ = ["DType", "Quantize", "WhisperRecognizer", "WhisperRecognizerConfig"]

logger = logging.getLogger(__name__)

REPEATED_PHRASE = 3  # tokens: the shortest repeat cut from a partial that does not loop


@dataclass(frozen=True, slots=True)
class _Decoded:
    """One utterance's greedy decoding, before the guard."""

    text: str
    avg_logprob: float
    no_speech_prob: float
    language: str
    language_probability: float | None  # None: pinned, not detected
    exhausted: bool  # ran out of tokens without <|endoftext|>
    tokens: list[int] = field(default_factory=list)  # the text tokens
    logprobs: list[float] = field(default_factory=list)  # each text token's
    words: tuple[WordTiming, ...] = ()
    # Tokens between the prompt and the text: the left context's text (forced) and what
    # the model wrote before this utterance's first word (`engine.context`).
    lead: list[int] = field(default_factory=list)


class WhisperRecognizer:
    """A Whisper checkpoint folder (see `engine.weights.resolve_model`) as a Recognizer."""

    def __init__(
        self,
        model_path: Path,
        config: WhisperRecognizerConfig | None = None,
        *,
        name: str | None = None,
    ) -> None:
        self.config = config or WhisperRecognizerConfig()
        self._name = name or model_path.name
        self._device = torch.device(self.config.device)
        loaded = WhisperForConditionalGeneration.from_pretrained(
            model_path,
            dtype=self.config.torch_dtype,
            local_files_only=True,
            output_loading_info=True,
        )
        # output_loading_info=True makes it a (model, info) pair, which the stubs do not say.
        model, info = cast(tuple[WhisperForConditionalGeneration, dict[str, Any]], loaded)
        problems = {k: info[k] for k in ("missing_keys", "mismatched_keys") if info[k]}
        if problems:
            raise ValueError(f"{model_path} does not load cleanly: {problems}")
        if info["unexpected_keys"]:
            logger.warning("%s: ignoring unexpected keys %s", model_path, info["unexpected_keys"])
        # nn.Module.to and .eval work in place (transformers' typed wrappers of them do not
        # type-check); the model is frozen and in inference mode from here on.
        torch.nn.Module.to(model, self._device)
        torch.nn.Module.eval(model)
        model.requires_grad_(False)
        if self.config.quantize in INT8_LAYERS:
            # Before the windows are built: they share the model's (int8) layers.
            replaced = quantize_linears(model, INT8_LAYERS[self.config.quantize])
            logger.info("%s: %d linear layers in int8", self._name, replaced)
        if self.config.encoder_torch_dtype != self.config.torch_dtype:
            torch.nn.Module.to(model.model.encoder, self.config.encoder_torch_dtype)
        if self.config.encoder_torch_dtype == torch.bfloat16 and self._device.type == "cpu":
            # The encoder is the only part transformers runs; torch's CPU flash attention
            # in bfloat16 is slower than plain matrix products (a 10 s window: 87 against
            # 73 ms: docs/performance.md, "The bfloat16 encoder's attention as plain products").
            model.set_attn_implementation("eager")
        self._model = model
        self._encoders = WindowedEncoders(
            self._model.model.encoder, (*self.config.windows, *self.config.partial_windows)
        )
        self._features = WhisperFeatureExtractor.from_pretrained(model_path, local_files_only=True)
        if self._features.feature_size != self._model.config.num_mel_bins:
            raise ValueError("feature extractor and model disagree on the number of mel bins")
        self._tokenizer = WhisperTokenizer.from_pretrained(model_path, local_files_only=True)
        generation: GenerationConfig = self._model.generation_config
        self._multilingual = bool(getattr(generation, "is_multilingual", False))
        self._lang_to_id: dict[str, int] = {
            token[2:-2]: index for token, index in getattr(generation, "lang_to_id", {}).items()
        }
        if self._multilingual and not self._lang_to_id:
            raise ValueError(f"{model_path}: a multilingual model without lang_to_id")
        self._sot = _token_setting(generation, "decoder_start_token_id")
        self._eot = _token_setting(generation, "eos_token_id")
        # Whisper's no-speech token sits just below <|notimestamps|> in every vocabulary.
        no_timestamps = _token_setting(generation, "no_timestamps_token_id")
        self._first_step = FirstStep(
            self._name,
            no_timestamps - 1,
            self._lang_to_id if self._multilingual else None,
            self._device,
        )
        # The prompt after <|startoftranscript|>: [language, task,] <|notimestamps|>.
        self._prompt_tail = [no_timestamps]
        if self._multilingual:
            task_to_id: dict[str, int] = getattr(generation, "task_to_id", {})
            if "transcribe" not in task_to_id:
                raise ValueError(f"{model_path}: a multilingual model without task_to_id")
            self._prompt_tail = [task_to_id["transcribe"], no_timestamps]
        # int8-shortlist: float32's tokens from an int8 shortlist (engine.vocabulary).
        head: VocabularyHead = FullHead(self._model.proj_out)
        if self.config.quantize == "int8-shortlist":
            head = ShortlistHead(self._model.proj_out)
        decoder = self._model.model.decoder
        greedy = functools.partial(
            GreedyDecoder,
            decoder,
            start_token=self._sot,
            end_token=self._eot,
            suppress_tokens=list(generation.suppress_tokens or []),
            begin_suppress_tokens=list(generation.begin_suppress_tokens or []),
        )
        self._greedy = greedy(head)
        # Partials only: int8 copies of the decoder's layers and projection (the config doc).
        self._partial_greedy = self._greedy
        if self.config.int8_partials:
            layers = [copy.deepcopy(layer) for layer in decoder.layers]
            replaced = sum(quantize_linears(layer) for layer in layers)
            # The shortlist's int8 projection where there is one (one copy, not two).
            int8 = (
                head.int8 if isinstance(head, ShortlistHead) else Int8Linear(self._model.proj_out)
            )
            int8_head = FullHead(int8)
            self._partial_greedy = greedy(int8_head, layers=layers)
            logger.info("%s: partials decode through %d int8 layers", self._name, replaced + 1)
        self._max_new_tokens_cap = self._model.config.max_target_positions // 2
        self._prev = _token_setting(generation, "prev_sot_token_id")
        # <|startofprev|>, the prompt, <|startoftranscript|>, [language,] the tail, the
        # tokens: the longest prompt must leave room for the longest decoding.
        longest = 3 + len(self._prompt_tail) + self.config.prompt_tokens + self._max_new_tokens_cap
        if longest > self._greedy.max_positions:
            room = self._greedy.max_positions - longest + self.config.prompt_tokens
            raise ValueError(f"prompt_tokens must be at most {room} for this model")
        self._aligner = self._build_aligner(generation, model_path)
        encoder = self.config.encoder_torch_dtype
        logger.info(
            "loaded %s on %s (%s%s%s), windows %s s",
            self._name,
            self._device,
            self.config.torch_dtype,
            "" if encoder == self.config.torch_dtype else f", encoder {encoder}",
            "" if self.config.quantize == "none" else f", {self.config.quantize}",
            self._encoders.windows,
        )

    def _build_aligner(self, generation: GenerationConfig, model_path: Path) -> Aligner | None:
        if not self.config.word_timings:
            return None
        heads = getattr(generation, "alignment_heads", None)
        if not heads:
            logger.warning("%s has no alignment heads: finals carry no word timings", model_path)
            return None
        strings = self._tokenizer.convert_ids_to_tokens(list(range(self._eot)))
        return Aligner(self._model.model.decoder, heads, strings, end_token=self._eot)

    @property
    def name(self) -> str:
        return self._name

    @property
    def max_batch_size(self) -> int:
        return self.config.max_batch_size

    @property
    def languages(self) -> frozenset[str]:
        """Every language code the model knows; just `en` for an English-only model."""
        return frozenset(self._lang_to_id) if self._multilingual else frozenset({ENGLISH})

    @property
    def windows(self) -> tuple[float, ...]:
        """The encoder window buckets in use, in seconds (finals' and partials')."""
        return self._encoders.windows

    @torch.inference_mode()
    def warmup(self) -> None:
        """Decode one second of silence in every window, so each path is initialised."""
        silence = Utterance(audio=np.zeros(SAMPLE_RATE, dtype=np.float32))
        for window in self.windows:
            self._forward([silence], window)

    def transcribe(
        self, batch: Sequence[Utterance], should_stop: StopCheck | None = None
    ) -> list[Transcription]:
        """One result per utterance, in order; batches above `max_batch_size` are split.

        `should_stop` is polled before each encoder pass (on the CPU the rows are encoded
        one by one: it costs the same per row) and before each decoder step; when it
        returns True the batch raises `Interrupted`.
        """
        results: list[Transcription] = []
        size = self.config.max_batch_size
        for start in range(0, len(batch), size):
            results.extend(self._transcribe_batch(batch[start : start + size], should_stop))
        if len(results) != len(batch):
            raise RuntimeError(f"{len(results)} results for {len(batch)} utterances")
        return results

    @torch.inference_mode()
    def _transcribe_batch(
        self, batch: Sequence[Utterance], should_stop: StopCheck | None
    ) -> list[Transcription]:
        batch = [self.fit_context(utterance) for utterance in batch]
        longest = max(context.span(utterance) for utterance in batch)
        window = self.window(batch)
        if longest > window:
            logger.warning(
                "utterance of %.1f s exceeds the %.0f s window; transcribing its first %.0f s",
                longest,
                window,
                window,
            )
        decoded = self._decode_in(batch, window, should_stop)
        # A row with a prompt or a left context that failed (`_conditioning_failed`) is
        # decoded once more without them, as Whisper's fallback drops the prompt.
        redo = [
            i
            for i, item in enumerate(decoded)
            if (batch[i].prompt or batch[i].left) and self._conditioning_failed(batch[i], item)
        ]
        if redo:
            plain = [dataclasses.replace(batch[i], prompt="", left=None) for i in redo]
            for i, item in zip(redo, self._decode_in(plain, window, should_stop), strict=True):
                decoded[i] = item
        return [self._postprocess(item) for item in decoded]

    def fit_context(self, utterance: Utterance) -> Utterance:
        """The utterance with as much of its left context as its window has room for: the
        window it has alone (`context_own_window`), else up to `context_window`."""
        margin = self.config.window_margin
        if utterance.left is None:
            return utterance
        if self.config.context_own_window:
            alone = self._window_for(dataclasses.replace(utterance, left=None))
            return context.filled(utterance, alone - margin)
        window_cap = min(self.config.context_window, self._encoders.full_window)
        return context.fitted(utterance, window_cap - margin)

    def window(self, batch: Sequence[Utterance]) -> float:
        """The encoder window `batch` is decoded in (before any retry): its rows' largest."""
        return max(self._window_for(utterance) for utterance in batch)

    def _window_for(self, utterance: Utterance) -> float:
        """The smallest window for one row: its audio plus the margin, a partial's among
        the partial windows too."""
        config, full = self.config, self._encoders.full_window
        if utterance.partial:
            seconds = context.span(utterance) + config.partial_margin
            return self._encoders.for_duration(
                seconds, (*config.windows, *config.partial_windows, full)
            )
        seconds = context.span(utterance) + config.window_margin
        return self._encoders.for_duration(seconds, (*config.windows, full))

    def _decode_in(
        self, batch: Sequence[Utterance], window: float, should_stop: StopCheck | None
    ) -> list[_Decoded]:
        """Decode in `window`; rows that loop there again on the full window, but partials:
        a partial keeps the first cycle of what it repeats (`_cut_repeats`)."""
        decoded = self._forward(batch, window, should_stop)
        decoded = [
            self._cut_repeats(item) if utterance.partial else item
            for utterance, item in zip(batch, decoded, strict=True)
        ]
        retry = [
            i
            for i, item in enumerate(decoded)
            if not batch[i].partial
            and not (batch[i].left and self.config.context_own_window)
            and self._should_retry(item, window)
        ]
        if retry:
            logger.debug(
                "%d looped in the %.0f s window; retrying on the full one", len(retry), window
            )
            again = self._forward(
                [batch[i] for i in retry], self._encoders.full_window, should_stop
            )
            for i, item in zip(retry, again, strict=True):
                decoded[i] = item
        return decoded

    def _cut_repeats(self, item: _Decoded) -> _Decoded:
        """A partial cut to the first cycle of what it repeats at its end
        (`guard.first_cycle`): in a short window tiny.en reads the speech, then reads it
        again into the padding, endlessly (a loop) or once more. Of a row that loops any
        repeat is cut, of one that does not only a phrase (REPEATED_PHRASE tokens or more:
        "no, no" stays); a cut that still ends in a repeat is cut again (the last one may be
        spelled in other tokens). The guard judges the cut text again."""
        min_period = 1 if self._verdict(item) is Verdict.LOOP else REPEATED_PHRASE
        tokens = item.tokens
        while (keep := first_cycle(tokens, min_period)) is not None:  # fewer tokens each pass
            tokens = tokens[:keep]
        if len(tokens) == len(item.tokens):
            return item
        return dataclasses.replace(
            item,
            text=self._tokenizer.decode(tokens, skip_special_tokens=True).strip(),
            tokens=tokens,
            logprobs=item.logprobs[: len(tokens)],
            exhausted=False,
        )

    def _conditioning_failed(self, utterance: Utterance, item: _Decoded) -> bool:
        """A row decoded after a prompt or behind a left context that went astray: the
        guard would drop it (a loop; or the context's text seemed to say it all, so
        nothing was written); the model was unsure of it (average log-probability under
        the guard's threshold, Whisper's own trigger for its fallback); or it said itself
        twice, or its context again. The last two are how tiny.en hallucinates behind a
        context: the breath after a sentence, heard after that sentence, became "I don't
        know." (log-probability -1.3) or "I will ask what you can do for your country."
        (the context re-read), where alone it is no speech (docs/performance.md)."""
        if self._verdict(item) is not Verdict.SPEECH:
            return True
        if item.avg_logprob < self.config.guard.logprob_threshold:
            return True
        left = utterance.left
        return left is not None and (
            context.repeats_itself(item.text) or context.repeats_context(item.text, left.text)
        )

    def _should_retry(self, item: _Decoded, window: float) -> bool:
        """A loop in a short window, on what the model still takes for speech."""
        guard = self.config.guard
        return (
            self.config.retry_loops_on_full_window
            and window < self._encoders.full_window
            and item.no_speech_prob <= guard.no_speech_threshold
            and looped(item.text, item.exhausted, guard)
        )

    def _forward(
        self, batch: Sequence[Utterance], window: float, should_stop: StopCheck | None = None
    ) -> list[_Decoded]:
        """Features, encoder and greedy decoding for one window; no guard."""
        # A batch of partials only decodes through the partials' weights (`partial_quantize`).
        decoder = self._partial_greedy if all(u.partial for u in batch) else self._greedy
        features = self._preprocess(batch, window)
        hidden = self._encode(window, features, should_stop)
        budgets = [
            token_budget(u.duration, self._tokens_per_second(u), self._max_new_tokens_cap)
            for u in batch
        ]
        prefixes = [self._prefix(utterance.prompt) for utterance in batch]
        forced = [self._draft_tokens(u.left.text) if u.left else [] for u in batch]
        # [The prefix,] <|startoftranscript|>, [language,] the prompt tail, [the left
        # context's text,] then the tokens.
        positions = (
            max(map(len, prefixes)) + 2 + len(self._prompt_tail) + max(map(len, forced))
        ) + max(budgets)
        positions = min(positions, decoder.max_positions)
        drafts = [
            self._draft_tokens(utterance.draft) if self.config.drafts else [] for utterance in batch
        ]
        known = self._pinned_languages(batch)
        if known is not None:
            # Every prompt is known before the logits at <|startoftranscript|> are read:
            # one decoder pass for all of it and the drafts (`GreedyDecoder.start_and_decode`).
            rows = [[*self._prompt_row(language), *forced[i]] for i, language in enumerate(known)]
            started, greedy = decoder.start_and_decode(
                hidden, positions, prefixes, rows, budgets, drafts, should_stop
            )
            first = self._first_step.read(started.logits, batch)
        else:
            started = decoder.start(hidden, positions, prefixes)
            first = self._first_step.read(started.logits, batch)
            rows = [
                [*self._prompt_row(language), *forced[i]]
                for i, language in enumerate(first.languages)
            ]
            width = max(map(len, rows))
            padded = [row + [self._eot] * (width - len(row)) for row in rows]
            prompts = torch.tensor(padded, dtype=torch.long, device=self._device)
            lengths = [len(row) for row in rows] if any(forced) else None
            greedy = decoder.decode(started, prompts, budgets, drafts, should_stop, lengths)
        decoded = self._read(greedy, budgets, forced, first)
        return self._with_words(decoded, batch, started, window, should_stop)

    def _pinned_languages(self, batch: Sequence[Utterance]) -> list[str] | None:
        """Each row's language where every one is known before decoding (an English-only
        model, or pinned ones), else None (some row's is to be detected)."""
        if not self._multilingual:
            return [ENGLISH] * len(batch)
        languages = [utterance.language for utterance in batch]
        for language in languages:
            if language is not None and language not in self._lang_to_id:
                raise ValueError(f"{self._name} does not know language {language!r}")
        return None if None in languages else cast(list[str], languages)

    def _tokens_per_second(self, utterance: Utterance) -> float:
        if utterance.partial:
            return self.config.partial_tokens_per_second
        return self.config.max_tokens_per_second

    def _with_words(
        self,
        decoded: list[_Decoded],
        batch: Sequence[Utterance],
        started: Started,
        window: float,
        should_stop: StopCheck | None,
    ) -> list[_Decoded]:
        """Word timings for the utterances that ask for them and keep this decoding (not
        to be decoded again on the full window, not dropped by the guard)."""
        if self._aligner is None:
            return decoded
        requests = [
            AlignmentRequest(
                row=i,
                tokens=item.tokens,
                logprobs=item.logprobs,
                prompt=[self._sot, *self._prompt_row(item.language), *item.lead],
                language=item.language,
                samples=round(context.span(utterance) * SAMPLE_RATE),
            )
            for i, (utterance, item) in enumerate(zip(batch, decoded, strict=True))
            if utterance.word_timings
            and item.tokens
            and not self._should_retry(item, window)
            and self._verdict(item) is Verdict.SPEECH
        ]
        if not requests:
            return decoded
        if should_stop is not None:
            _check(should_stop)
        timings = self._aligner.align(started.cross, requests)
        out = list(decoded)
        for request, words in zip(requests, timings, strict=True):
            utterance = batch[request.row]
            if utterance.left is not None:
                words = context.shifted(words, utterance.left.duration, utterance.duration)
            out[request.row] = dataclasses.replace(out[request.row], words=words)
        return out

    def _prompt_row(self, language: str) -> list[int]:
        """The prompt after <|startoftranscript|>: [language, task,] <|notimestamps|>."""
        if self._multilingual:
            return [self._lang_to_id[language], *self._prompt_tail]
        return list(self._prompt_tail)

    def _encode(
        self, window: float, features: torch.Tensor, should_stop: StopCheck | None
    ) -> torch.Tensor:
        """Encoder states for a batch; with `should_stop` on the CPU, one row at a time so
        a stop takes effect within one row's encoding (the encoder is compute-bound there:
        a row costs the same alone as in a batch)."""
        if should_stop is None:
            return self._encoders.encode(window, features)
        if self._device.type != "cpu":
            _check(should_stop)
            return self._encoders.encode(window, features)
        rows = []
        for row in torch.split(features, 1):
            _check(should_stop)
            rows.append(self._encoders.encode(window, row))
        return torch.cat(rows)

    def _preprocess(self, batch: Sequence[Utterance], window: float) -> torch.Tensor:
        samples = round(window * SAMPLE_RATE)
        inputs = self._features(
            [context.window_audio(utterance) for utterance in batch],
            sampling_rate=SAMPLE_RATE,
            padding="max_length",
            max_length=samples,
            truncation=True,
            return_tensors="pt",
        )
        features: torch.Tensor = inputs["input_features"]
        if features.shape[-1] != self._encoders.frames(window):
            raise RuntimeError(f"{features.shape[-1]} mel frames for a {window} s window")
        return features.to(self._device, self.config.torch_dtype)

    def _read(
        self, greedy: Greedy, budgets: list[int], forced: list[list[int]], first: FirstRead
    ) -> list[_Decoded]:
        """Each row's decoding after its prompt and forced tokens (its left context's text)."""
        decoded = []
        for i, tokens in enumerate(greedy.tokens.tolist()):
            row = read_row(tokens, greedy.logprobs[i], end_token=self._eot, budget=budgets[i])
            # After a context's text, what comes before the first word is the context's.
            trim = context.lead_trimmed(row.tokens, self._spell) if forced[i] else 0
            decoded.append(
                _Decoded(
                    text=self._tokenizer.decode(
                        row.tokens[trim:], skip_special_tokens=True
                    ).strip(),
                    avg_logprob=row.avg_logprob,
                    no_speech_prob=first.no_speech[i],
                    language=first.languages[i],
                    language_probability=first.probabilities[i],
                    exhausted=row.exhausted,
                    tokens=row.tokens[trim:],
                    logprobs=row.token_logprobs[trim:],
                    lead=[*forced[i], *row.tokens[:trim]],
                )
            )
        return decoded

    def _spell(self, token: int) -> str:
        return str(self._tokenizer.decode([token]))

    def _draft_tokens(self, text: str) -> list[int]:
        """A draft's tokens as the model would write them (text after a space)."""
        if not text.strip():
            return []
        ids: list[int] = self._tokenizer.encode(" " + text.strip(), add_special_tokens=False)
        return [token for token in ids if token < self._eot]

    def _prefix(self, prompt: str) -> list[int]:
        """What an utterance reads before <|startoftranscript|>: <|startofprev|> and the last
        `prompt_tokens` tokens of its prompt (Whisper's condition on previous text), or
        nothing."""
        keep = self.config.prompt_tokens
        tokens = self._draft_tokens(prompt) if keep else []
        return [self._prev, *tokens[-keep:]] if tokens else []

    def _verdict(self, decoded: _Decoded) -> Verdict:
        return judge(
            decoded.text,
            avg_logprob=decoded.avg_logprob,
            no_speech_prob=decoded.no_speech_prob,
            exhausted=decoded.exhausted,
            config=self.config.guard,
        )

    def _postprocess(self, decoded: _Decoded) -> Transcription:
        verdict = self._verdict(decoded)
        if verdict is not Verdict.SPEECH:
            logger.debug("guard dropped %r (%s; %s)", decoded.text, verdict.value, decoded)
        return Transcription(
            text=decoded.text if verdict is Verdict.SPEECH else "",
            language=decoded.language,
            avg_logprob=decoded.avg_logprob,
            no_speech_prob=decoded.no_speech_prob,
            language_probability=decoded.language_probability,
            words=decoded.words if verdict is Verdict.SPEECH else (),
        )


def _check(should_stop: StopCheck) -> None:
    if should_stop():
        raise Interrupted("the batch was stopped")


def _token_setting(generation: GenerationConfig, name: str) -> int:
    value = getattr(generation, name, None)
    if not isinstance(value, int):
        raise ValueError(f"the generation config has no {name}: not a Whisper model's")
    return value
