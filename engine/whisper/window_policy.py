"""Which encoder window each utterance is decoded in, with how much left context, and which
decodings are decoded again.

Windows: a short window saves most of the encoder's work, but tiny.en loops ("Go forward
10 meters. Go forward 10 meters. ...") when the window leaves little silence after the
speech: on the corpus, 5 s windows looped on 3 of 6 clips under 3.5 s, and windows of
10 s or more with 1 s to spare looped once in 27 clips. So the default windows start at
10 s, and utterances whose decoding still loops, while the model takes them for speech,
are decoded once more, together, on the full 30 s window (like Whisper's temperature
fallback, but changing the window): one decoding per batch, a second one only for those
(`retries`).

Partials (`Utterance.partial`) are shown for a moment and replaced, so they trade a few
loops for cost: a partial's window is the smallest of `partial_windows` (4/6/8 s) and the
finals' windows that holds its audio plus `partial_margin` (2 s), and a partial is never
decoded a second time on the full window. In a short window tiny.en often reads the
speech and then reads it again into the padding; a partial keeps the first reading
(`cut_repeats`): the encoder's window much shorter on average, a few partials empty
(docs/history/2026-12-02-partials-and-bfloat16.md#cheaper-partials-issue-15).

Left context (`engine.whisper.context`) fills the window up to `context_window`, or only the
room the utterance leaves in its own window (`context_own_window`: `fit_context`). A row
decoded after a prompt, behind a left context or with keyterms that went astray is decoded
once more without them, as Whisper's fallback drops the prompt (`fallbacks`): keyterms
that make a row loop ("Istio, Istio, ...") give way to the plain decoding.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from engine.api import Utterance
from engine.whisper import context
from engine.whisper.config import WhisperRecognizerConfig
from engine.whisper.decoding import Decoded
from engine.whisper.guard import Verdict, first_cycle, judge, looped
from engine.whisper.windows import WindowedEncoders

REPEATED_PHRASE = 3  # tokens: the shortest repeat cut from a partial that does not loop


class WindowPolicy:
    """The window and retry decisions for one recognizer's `config` and encoder windows;
    `text` makes text of tokens (the model's tokenizer)."""

    def __init__(
        self,
        config: WhisperRecognizerConfig,
        encoders: WindowedEncoders,
        text: Callable[[list[int]], str],
    ) -> None:
        self._config = config
        self._encoders = encoders
        self._text = text

    def fit_context(self, utterance: Utterance) -> Utterance:
        """The utterance with as much of its left context as its window has room for: the
        window it has alone (`context_own_window`), else up to `context_window`."""
        margin = self._config.window_margin
        if utterance.left is None:
            return utterance
        if self._config.context_own_window:
            alone = self.window_for(dataclasses.replace(utterance, left=None))
            return context.filled(utterance, alone - margin)
        window_cap = min(self._config.context_window, self._encoders.full_window)
        return context.fitted(utterance, window_cap - margin)

    def window(self, batch: Sequence[Utterance]) -> float:
        """The encoder window `batch` is decoded in (before any retry): its rows' largest."""
        return max(self.window_for(utterance) for utterance in batch)

    def window_for(self, utterance: Utterance) -> float:
        """The smallest window for one row: its audio plus the margin, a partial's among
        the partial windows too."""
        config, full = self._config, self._encoders.full_window
        if utterance.partial:
            seconds = context.span(utterance) + config.partial_margin
            return self._encoders.for_duration(
                seconds, (*config.windows, *config.partial_windows, full)
            )
        seconds = context.span(utterance) + config.window_margin
        return self._encoders.for_duration(seconds, (*config.windows, full))

    def verdict(self, decoded: Decoded) -> Verdict:
        """The hallucination guard's verdict on a decoding (`engine.whisper.guard`)."""
        return judge(
            decoded.text,
            avg_logprob=decoded.avg_logprob,
            no_speech_prob=decoded.no_speech_prob,
            exhausted=decoded.exhausted,
            config=self._config.guard,
        )

    def cut_repeats(self, item: Decoded) -> Decoded:
        """A partial cut to the first cycle of what it repeats at its end
        (`guard.first_cycle`): in a short window tiny.en reads the speech, then reads it
        again into the padding, endlessly (a loop) or once more. Of a row that loops any
        repeat is cut, of one that does not only a phrase (REPEATED_PHRASE tokens or more:
        "no, no" stays); a cut that still ends in a repeat is cut again (the last one may be
        spelled in other tokens). The guard judges the cut text again."""
        min_period = 1 if self.verdict(item) is Verdict.LOOP else REPEATED_PHRASE
        tokens = item.tokens
        while (keep := first_cycle(tokens, min_period)) is not None:  # fewer tokens each pass
            tokens = tokens[:keep]
        if len(tokens) == len(item.tokens):
            return item
        return dataclasses.replace(
            item,
            text=self._text(tokens),
            tokens=tokens,
            logprobs=item.logprobs[: len(tokens)],
            exhausted=False,
        )

    def retries(
        self, batch: Sequence[Utterance], decoded: Sequence[Decoded], window: float
    ) -> list[int]:
        """The rows to decode again on the full window: finals that looped in `window`,
        but those whose context fills their own window (the fallback redoes them there)."""
        return [
            i
            for i, item in enumerate(decoded)
            if not batch[i].partial
            and not (batch[i].left and self._config.context_own_window)
            and self.should_retry(item, window)
        ]

    def should_retry(self, item: Decoded, window: float) -> bool:
        """A loop in a short window, on what the model still takes for speech."""
        guard = self._config.guard
        return (
            self._config.retry_loops_on_full_window
            and window < self._encoders.full_window
            and item.no_speech_prob <= guard.no_speech_threshold
            and looped(item.text, item.exhausted, guard)
        )

    def fallbacks(self, batch: Sequence[Utterance], decoded: Sequence[Decoded]) -> list[int]:
        """The rows with a prompt, a left context or keyterms whose conditioning failed, to
        decode again without them (`conditioning_failed`)."""
        return [
            i
            for i, item in enumerate(decoded)
            if (batch[i].prompt or batch[i].left or batch[i].keyterms)
            and self.conditioning_failed(batch[i], item)
        ]

    def conditioning_failed(self, utterance: Utterance, item: Decoded) -> bool:
        """A row decoded after a prompt or behind a left context that went astray: the
        guard would drop it (a loop; or the context's text seemed to say it all, so
        nothing was written); the model was unsure of it (average log-probability under
        the guard's threshold, Whisper's own trigger for its fallback); or it said itself
        twice, or its context again. The last two are how tiny.en hallucinates behind a
        context: the breath after a sentence, heard after that sentence, became "I don't
        know." (log-probability -1.3) or "I will ask what you can do for your country."
        (the context re-read), where alone it is no speech
        (docs/history/2026-12-04-context-hallucination.md#what-failed-and-why)."""
        if self.verdict(item) is not Verdict.SPEECH:
            return True
        if item.avg_logprob < self._config.guard.logprob_threshold:
            return True
        left = utterance.left
        return left is not None and (
            context.repeats_itself(item.text) or context.repeats_context(item.text, left.text)
        )
