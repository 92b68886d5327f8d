"""Batched Whisper on torch + transformers: the `Recognizer` the scheduler drives.

One batch runs in three phases. Preprocess (CPU): log-mel features, padded to the
smallest encoder window (`engine.whisper.windows`) that holds the batch's longest utterance plus
a margin (`engine.whisper.window_policy`). Forward: the windowed encoder, then greedy decoding
(`engine.whisper.greedy`, a lean decoder step over the model's own layers, several times cheaper
per step than transformers' `generate()` on CPU): one decoder step at
<|startoftranscript|> (no-speech probability, and the language where a multilingual model
must detect it), then the rest of each row's prompt and the greedy tokens. Postprocess
(CPU): decode, average log-probability, hallucination guard (`engine.whisper.guard`). Rows that
loop in a short window are decoded again on the full one, and rows whose prompt or left
context led them astray again without it (`engine.whisper.window_policy`). The model, its int8
layers and heads, and its prompt tokens are `engine.whisper.model`'s.

Languages: each utterance either pins its language (`Utterance.language`) or leaves it to
be detected. Detection reads the language tokens' logits off the decoder step that
computes the no-speech probability anyway, as Whisper's own `detect_language` does, so it
needs no extra encoder pass; it is computed only for the rows that ask for it. Each row's
prompt then carries its own language token, so a batch mixes sources of different
languages freely.

Partials (`Utterance.partial`) take shorter windows (`engine.whisper.window_policy`) and a token
budget of `partial_tokens_per_second` (5) per second of audio plus a few (speech is
~3-4); a batch of partials only decodes through the partials' weights where
`partial_quantize` gives them their own.

Prompts: an utterance's `prompt` (its source's previous text) is read before
<|startoftranscript|> after <|startofprev|>, its last `prompt_tokens` tokens, as Whisper
conditions on previous text; the no-speech probability is read after it, as Whisper's.
Rows with and without prompts share a batch (`engine.whisper.greedy` keeps each row's attention
on its own tokens). Whisper's encoder never masks padding (it was trained on zero-padded
windows).
Left context (`Utterance.left`, `engine.whisper.context`): the audio said before an utterance goes
in the window ahead of it and that audio's text is forced after <|notimestamps|>, so the
model writes on from there (rows' forced texts differ in length: `engine.whisper.greedy`).
Word timings (`engine.whisper.alignment`) are computed for the utterances that ask for them
(`Utterance.word_timings`: finals, not partials), once their decoding is kept: one more
decoder pass over those rows' tokens (without the prompt, as Whisper aligns), reusing the
greedy decoder's encoder keys and values.

The recognizer never sets torch's thread count; the process that owns it decides.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from engine.api import SAMPLE_RATE, Transcription, Utterance
from engine.choices import DType, Quantize
from engine.recognizer import Interrupted, StopCheck
from engine.whisper import context, keyterms, soundalike
from engine.whisper.alignment import AlignmentRequest
from engine.whisper.config import WhisperRecognizerConfig
from engine.whisper.decoding import Decoded, read_row, token_budget
from engine.whisper.first_step import FirstRead
from engine.whisper.greedy import Greedy, Started
from engine.whisper.guard import Verdict
from engine.whisper.model import WhisperModel
from engine.whisper.window_policy import WindowPolicy

__all__ = ["DType", "Quantize", "WhisperRecognizer", "WhisperRecognizerConfig"]

logger = logging.getLogger(__name__)


class WhisperRecognizer:
    """A Whisper checkpoint folder (see `engine.whisper.weights.resolve_model`) as a Recognizer."""

    def __init__(
        self,
        model_path: Path,
        config: WhisperRecognizerConfig | None = None,
        *,
        name: str | None = None,
    ) -> None:
        self.config = config or WhisperRecognizerConfig()
        self._name = name or model_path.name
        self._whisper = WhisperModel(model_path, self.config, self._name)
        self._policy = WindowPolicy(self.config, self._whisper.encoders, self._whisper.text)

    @property
    def name(self) -> str:
        return self._name

    @property
    def languages(self) -> frozenset[str]:
        """Every language code the model knows; just `en` for an English-only model."""
        return self._whisper.languages

    @property
    def whisper(self) -> WhisperModel:
        """The loaded model's parts (encoders, decoders, tokens), read-only: for tests and
        benches that run one stage of a batch on its own."""
        return self._whisper

    @property
    def windows(self) -> tuple[float, ...]:
        """The encoder window buckets in use, in seconds (finals' and partials')."""
        return self._whisper.encoders.windows

    @torch.inference_mode()
    def warmup(self) -> None:
        """Decode one second of silence in every window, so each path is initialised."""
        silence = Utterance(audio=np.zeros(SAMPLE_RATE, dtype=np.float32))
        for window in self.windows:
            self.forward([silence], window)

    def transcribe(
        self, batch: Sequence[Utterance], should_stop: StopCheck | None = None
    ) -> list[Transcription]:
        """One result per utterance, in order; with `config.max_batch_size`, batches above
        it are split (the scheduler sends batches within its own bound: it leaves it None).

        `should_stop` is polled before each encoder pass (on the CPU the rows are encoded
        one by one: it costs the same per row) and before each decoder step; when it
        returns True the batch raises `Interrupted`.
        """
        results: list[Transcription] = []
        size = self.config.max_batch_size or max(1, len(batch))
        for start in range(0, len(batch), size):
            results.extend(self._transcribe_batch(batch[start : start + size], should_stop))
        if len(results) != len(batch):
            raise RuntimeError(f"{len(results)} results for {len(batch)} utterances")
        return results

    def fit_context(self, utterance: Utterance) -> Utterance:
        """The utterance with as much of its left context as its window has room for
        (`WindowPolicy.fit_context`)."""
        return self._policy.fit_context(utterance)

    def window(self, batch: Sequence[Utterance]) -> float:
        """The encoder window `batch` is decoded in (before any retry): its rows' largest."""
        return self._policy.window(batch)

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
        # A row with a prompt, a left context or keyterms that failed
        # (`conditioning_failed`) is decoded once more without them, as Whisper's
        # fallback drops the prompt.
        redo = self._policy.fallbacks(batch, decoded)
        if redo:
            plain = [dataclasses.replace(batch[i], prompt="", left=None, keyterms=()) for i in redo]
            for i, item in zip(redo, self._decode_in(plain, window, should_stop), strict=True):
                decoded[i] = item
        return [
            self._postprocess(self._rewritten(item, utterance.keyterms))
            for item, utterance in zip(decoded, batch, strict=True)
        ]

    def _decode_in(
        self, batch: Sequence[Utterance], window: float, should_stop: StopCheck | None
    ) -> list[Decoded]:
        """Decode in `window`; rows that loop there again on the full window, but partials:
        a partial keeps the first cycle of what it repeats (`cut_repeats`)."""
        decoded = self.forward(batch, window, should_stop)
        decoded = [
            self._policy.cut_repeats(item) if utterance.partial else item
            for utterance, item in zip(batch, decoded, strict=True)
        ]
        retry = self._policy.retries(batch, decoded, window)
        if retry:
            logger.debug(
                "%d looped in the %.0f s window; retrying on the full one", len(retry), window
            )
            full = self._whisper.encoders.full_window
            again = self.forward([batch[i] for i in retry], full, should_stop)
            for i, item in zip(retry, again, strict=True):
                decoded[i] = item
        return decoded

    def forward(
        self, batch: Sequence[Utterance], window: float, should_stop: StopCheck | None = None
    ) -> list[Decoded]:
        """Features, encoder and greedy decoding for one window; no guard."""
        whisper = self._whisper
        # A batch of partials only decodes through the partials' weights (`partial_quantize`).
        decoder = whisper.partial_greedy if all(u.partial for u in batch) else whisper.greedy
        features = self.preprocess(batch, window)
        hidden = self._encode(window, features, should_stop)
        budgets = [
            token_budget(u.duration, self._tokens_per_second(u), whisper.max_new_tokens_cap)
            for u in batch
        ]
        prefixes = [
            whisper.prefix(u.prompt, u.keyterms if self.config.keyterm_prompt else ())
            for u in batch
        ]
        boost = keyterms.boost_for(
            [whisper.term_tokens(u.keyterms) for u in batch],
            decoder.vocabulary,
            start=self.config.keyterm_start,
            go_on=self.config.keyterm_continue,
        )
        forced = [whisper.draft_tokens(u.left.text) if u.left else [] for u in batch]
        # [The prefix,] <|startoftranscript|>, [language,] the prompt tail, [the left
        # context's text,] then the tokens.
        positions = (
            max(map(len, prefixes)) + 2 + len(whisper.prompt_tail) + max(map(len, forced))
        ) + max(budgets)
        positions = min(positions, decoder.max_positions)
        drafts = [
            whisper.draft_tokens(utterance.draft) if self.config.drafts else []
            for utterance in batch
        ]
        known = whisper.pinned_languages(batch)
        if known is not None:
            # Every prompt is known before the logits at <|startoftranscript|> are read:
            # one decoder pass for all of it and the drafts (`GreedyDecoder.start_and_decode`).
            rows = [[*whisper.prompt_row(language), *forced[i]] for i, language in enumerate(known)]
            started, greedy = decoder.start_and_decode(
                hidden, positions, prefixes, rows, budgets, drafts, should_stop, boost
            )
            first = whisper.first_step.read(started.logits, batch)
        else:
            started = decoder.start(hidden, positions, prefixes)
            first = whisper.first_step.read(started.logits, batch)
            rows = [
                [*whisper.prompt_row(language), *forced[i]]
                for i, language in enumerate(first.languages)
            ]
            width = max(map(len, rows))
            padded = [row + [whisper.eot] * (width - len(row)) for row in rows]
            prompts = torch.tensor(padded, dtype=torch.long, device=whisper.device)
            lengths = [len(row) for row in rows] if any(forced) else None
            greedy = decoder.decode(started, prompts, budgets, drafts, should_stop, lengths, boost)
        decoded = self._read(greedy, budgets, forced, first)
        return self._with_words(decoded, batch, started, window, should_stop)

    def _tokens_per_second(self, utterance: Utterance) -> float:
        if utterance.partial:
            return self.config.partial_tokens_per_second
        return self.config.max_tokens_per_second

    def _with_words(
        self,
        decoded: list[Decoded],
        batch: Sequence[Utterance],
        started: Started,
        window: float,
        should_stop: StopCheck | None,
    ) -> list[Decoded]:
        """Word timings for the utterances that ask for them and keep this decoding (not
        to be decoded again on the full window, not dropped by the guard)."""
        whisper = self._whisper
        if whisper.aligner is None:
            return decoded
        requests = [
            AlignmentRequest(
                row=i,
                tokens=item.tokens,
                logprobs=item.logprobs,
                prompt=[whisper.sot, *whisper.prompt_row(item.language), *item.lead],
                language=item.language,
                samples=round(context.span(utterance) * SAMPLE_RATE),
            )
            for i, (utterance, item) in enumerate(zip(batch, decoded, strict=True))
            if utterance.word_timings
            and item.tokens
            and not self._policy.should_retry(item, window)
            and self._policy.verdict(item) is Verdict.SPEECH
        ]
        if not requests:
            return decoded
        if should_stop is not None:
            _check(should_stop)
        timings = whisper.aligner.align(started.cross, requests)
        out = list(decoded)
        for request, words in zip(requests, timings, strict=True):
            utterance = batch[request.row]
            if utterance.left is not None:
                words = context.shifted(words, utterance.left.duration, utterance.duration)
            out[request.row] = dataclasses.replace(out[request.row], words=words)
        return out

    def _encode(
        self, window: float, features: torch.Tensor, should_stop: StopCheck | None
    ) -> torch.Tensor:
        """Encoder states for a batch; with `should_stop` on the CPU, one row at a time so
        a stop takes effect within one row's encoding (the encoder is compute-bound there:
        a row costs the same alone as in a batch)."""
        encoders = self._whisper.encoders
        if should_stop is None:
            return encoders.encode(window, features)
        if self._whisper.device.type != "cpu":
            _check(should_stop)
            return encoders.encode(window, features)
        rows = []
        for row in torch.split(features, 1):
            _check(should_stop)
            rows.append(encoders.encode(window, row))
        return torch.cat(rows)

    def preprocess(self, batch: Sequence[Utterance], window: float) -> torch.Tensor:
        samples = round(window * SAMPLE_RATE)
        inputs = self._whisper.features(
            [context.window_audio(utterance) for utterance in batch],
            sampling_rate=SAMPLE_RATE,
            padding="max_length",
            max_length=samples,
            truncation=True,
            return_tensors="pt",
        )
        features: torch.Tensor = inputs["input_features"]
        if features.shape[-1] != self._whisper.encoders.frames(window):
            raise RuntimeError(f"{features.shape[-1]} mel frames for a {window} s window")
        return features.to(self._whisper.device, self.config.torch_dtype)

    def _read(
        self, greedy: Greedy, budgets: list[int], forced: list[list[int]], first: FirstRead
    ) -> list[Decoded]:
        """Each row's decoding after its prompt and forced tokens (its left context's text)."""
        whisper = self._whisper
        decoded = []
        for i, tokens in enumerate(greedy.tokens.tolist()):
            row = read_row(tokens, greedy.logprobs[i], end_token=whisper.eot, budget=budgets[i])
            # After a context's text, what comes before the first word is the context's.
            trim = context.lead_trimmed(row.tokens, whisper.spell) if forced[i] else 0
            decoded.append(
                Decoded(
                    text=whisper.text(row.tokens[trim:]),
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

    def _rewritten(self, decoded: Decoded, terms: Sequence[str]) -> Decoded:
        """The decoding with the keyterms written where unsure words sound like them
        (`engine.whisper.soundalike`); its words (with timings) merged alike, if it has them."""
        if not terms or not self.config.keyterm_rewrite or not decoded.tokens:
            return decoded
        timed = bool(decoded.words)
        words = decoded.words or soundalike.token_words(
            [self._whisper.spell(t) for t in decoded.tokens], decoded.logprobs
        )
        rewritten = soundalike.rewrite(words, terms)
        if rewritten == tuple(words):
            return decoded
        return dataclasses.replace(
            decoded,
            text="".join(w.word for w in rewritten).strip(),
            words=rewritten if timed else (),
        )

    def _postprocess(self, decoded: Decoded) -> Transcription:
        verdict = self._policy.verdict(decoded)
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
