"""Where per-utterance decoding loses words: the same VAD segments, decoded several ways.

    python -m bench.segments --sets dialogue --variants base prompt pad30 ts
    python -m bench.segments --sets dialogue --show base
    python -m bench.segments --model base --sets dialogue --variants base ctx2@20

Each track of a `bench.quality` set is cut into utterances exactly as the file path cuts
it (Silero VAD, the server's default `SegmenterConfig`), then every variant decodes the
same utterances one by one (batch 1) and scores the joined text (corpus-level WER over
the set, `loadgen.wer`). Variants:

- `base`: the server without prompts (10/15/20/30 s windows, <|notimestamps|>).
- `prompt`: after the source's previous finals' text (`PARLEY_PROMPT_TOKENS=128`).
- `pad30`: every utterance in the full 30 s window.
- `roll+X`: X seconds more audio on both sides (never into the neighbours).
- `ts`: transformers' `generate()` with timestamps, 30 s window (offline's decoding mode).
- `nots`: the same without timestamps (should match `pad30`).
- `ctx[N][@SECONDS][+real|+prompt]`: the server's left context (`Utterance.left`, the recognizer's
  guard and redo included): the previous utterance and the gap (zeros, at most
  `MAX_GAP`, or `+real`: the audio as it was) if together at most SECONDS (10); with N,
  up to N previous utterances; `+prompt`: the text before them as the prompt;
  `~W` (`~own`): the context cut at a word of its text to fit a W s window (the window
  the utterance has alone), as `engine.whisper.context.filled` cuts it; `~ownX`: the same,
  leaving X s of the window after the utterance (the margin, 1 s, by default).
- `left`: (the first try, no guard) the previous utterance's audio and the gap before
  it in the window, its final's text forced after <|notimestamps|>, the rest decoded
  on (left context).
- `leftz`: `left` with the gap between the utterances as zeros (what a committer that
  keeps only the previous utterance's audio has).
- `left+prompt`: the same, with the older text as the `<|startofprev|>` prompt.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from bench.quality import MODELS, SETS, Offline, Track
from engine.api import SAMPLE_RATE, AudioArray, LeftContext, Utterance, WordTiming
from engine.whisper import context
from engine.whisper.decoding import read_row, token_budget
from engine.whisper.recognizer import WhisperRecognizer, WhisperRecognizerConfig
from engine.whisper.weights import resolve_model
from loadgen.wer import ErrorCounts, error_counts
from session.audio import FrameDecoder
from session.pipeline import AudioPipeline
from session.said_before import MAX_GAP
from session.segmenter import SegmenterConfig, UtteranceEnded
from session.vad import WINDOW, DirectScorer, SileroVad
from wire.codes import Encoding


@dataclasses.dataclass(frozen=True, slots=True)
class Segment:
    start: int
    end: int


async def segments(track: Track, vad: SileroVad, config: SegmenterConfig) -> list[Segment]:
    """The utterances the file path cuts `track` into."""
    pipeline = AudioPipeline(
        FrameDecoder(Encoding.PCM_S16LE, SAMPLE_RATE), DirectScorer(vad), config
    )
    audio = track.audio
    tail = len(audio) % WINDOW
    padded = np.concatenate([audio, np.zeros(WINDOW - tail if tail else 0, np.float32)])
    events = [*await pipeline.push(padded), *pipeline.cut()]
    return [
        Segment(e.start, min(e.end, len(audio))) for e in events if isinstance(e, UtteranceEnded)
    ]


Decode = Callable[[Track, list[Segment]], list[str]]


class Variants:
    def __init__(self, recognizer: WhisperRecognizer, offline: Offline) -> None:
        self.r = recognizer
        self.offline = offline
        self.windows: list[float] = []  # the window each `ctx` row was decoded in
        self.kept: list[float] = []  # the seconds of context each `ctx` row kept

    def base(self, track: Track, segs: list[Segment]) -> list[str]:
        return [self._one(track.audio[s.start : s.end]) for s in segs]

    def prompt(self, track: Track, segs: list[Segment]) -> list[str]:
        texts: list[str] = []
        context = ""
        for s in segs:
            text = self._one(track.audio[s.start : s.end], prompt=context)
            texts.append(text)
            context = (context + " " + text)[-1000:].strip() if text else ""
        return texts

    def pad30(self, track: Track, segs: list[Segment]) -> list[str]:
        return [self._one(track.audio[s.start : s.end], window=30.0) for s in segs]

    def roll(self, extra: float) -> Decode:
        def decode(track: Track, segs: list[Segment]) -> list[str]:
            out = []
            pad = round(extra * SAMPLE_RATE)
            for i, s in enumerate(segs):
                low = segs[i - 1].end if i else 0
                high = segs[i + 1].start if i + 1 < len(segs) else len(track.audio)
                out.append(self._one(track.audio[max(low, s.start - pad) : min(high, s.end + pad)]))
            return out

        return decode

    @torch.inference_mode()
    def ts(self, track: Track, segs: list[Segment], timestamps: bool = True) -> list[str]:
        out = []
        o = self.offline
        for s in segs:
            inputs = o.processor(
                track.audio[s.start : s.end], sampling_rate=SAMPLE_RATE, return_tensors="pt"
            )
            tokens = o.model.generate(**inputs, return_timestamps=timestamps)
            out.append(str(o.processor.batch_decode(tokens, skip_special_tokens=True)[0]).strip())  # type: ignore[no-untyped-call]
        return out

    def whole(self, track: Track, segs: list[Segment]) -> list[str]:
        return [self.offline.transcribe(track.audio, condition=True)]

    def nots(self, track: Track, segs: list[Segment]) -> list[str]:
        return self.ts(track, segs, timestamps=False)

    def left_zeros(self, track: Track, segs: list[Segment]) -> list[str]:
        return self.left(track, segs, zero_gap=True)

    def left(
        self, track: Track, segs: list[Segment], prompted: bool = False, zero_gap: bool = False
    ) -> list[str]:
        texts: list[str] = []
        for i, s in enumerate(segs):
            if i == 0 or not texts[-1]:
                texts.append(self._one(track.audio[s.start : s.end]))
                continue
            begin = segs[i - 1].start
            if (s.end - begin) / SAMPLE_RATE + 1.0 > 30.0:
                texts.append(self._one(track.audio[s.start : s.end]))
                continue
            older = " ".join(texts[:-1])[-1000:] if prompted else ""
            audio = track.audio[begin : s.end].copy()
            if zero_gap:
                audio[segs[i - 1].end - begin : s.start - begin] = 0.0
            texts.append(self._one(audio, prompt=older, forced=texts[-1]))
        return texts

    def ctx(
        self,
        limit: float,
        real_gap: bool,
        count: int = 1,
        prompted: bool = False,
        cut: str = "",
    ) -> Decode:
        """The server's left context: the recognizer with `Utterance.left` (guard and
        redo included), as the committer builds it (the gap as zeros, at most MAX_GAP,
        or as the audio was; none after an empty final or past `limit` seconds)."""

        def decode(track: Track, segs: list[Segment]) -> list[str]:
            texts: list[str] = []
            words: list[tuple[WordTiming, ...]] = []
            for i, s in enumerate(segs):
                left = None
                pieces: list[AudioArray] = []
                said: list[str] = []
                timed: list[WordTiming] = []
                for k in range(i - 1, max(-1, i - 1 - count), -1):
                    if not texts[k]:
                        break
                    before, after = segs[k], segs[k + 1]
                    gap = track.audio[before.end : after.start]
                    if not real_gap:
                        gap = np.zeros(min(len(gap), round(MAX_GAP * SAMPLE_RATE)), np.float32)
                    piece = np.concatenate([track.audio[before.start : before.end], gap])
                    if (sum(map(len, pieces)) + len(piece)) / SAMPLE_RATE > limit:
                        break
                    length = len(piece) / SAMPLE_RATE
                    timed = [*words[k], *(moved(w, length) for w in timed)]
                    pieces.insert(0, piece)
                    said.insert(0, texts[k])
                    # As `SaidBefore` builds it: the context of fewer utterances inside,
                    # for a recognizer whose window has room for the last one only.
                    left = LeftContext(
                        np.concatenate(pieces), " ".join(said), shorter=left, words=tuple(timed)
                    )
                older = " ".join(texts[: i - len(pieces)])[-1000:] if prompted else ""
                utterance = Utterance(
                    track.audio[s.start : s.end], left=left, prompt=older, word_timings=True
                )
                if cut:
                    utterance = self._cut(utterance, cut)
                if cut and prompted:  # the prompt: what was said before the kept context
                    said_all = " ".join(t for t in texts if t)
                    kept = utterance.left.text if utterance.left else ""
                    if kept and said_all.endswith(kept):
                        said_all = said_all[: -len(kept)]
                    utterance = dataclasses.replace(utterance, prompt=said_all[-1000:].strip())
                fitted = self.r.fit_context(utterance)
                self.windows.append(self.r.window([fitted]))
                self.kept.append(fitted.left.duration if fitted.left else 0.0)
                result = self.r.transcribe([utterance])[0]
                texts.append(result.text)
                words.append(result.words)
            return texts

        return decode

    def _cut(self, utterance: Utterance, cut: str) -> Utterance:
        """The context cut at a word to fit the window `cut` (seconds, or `own`: the one
        the utterance has alone), as `context.filled` cuts it."""
        margin = self.r.config.window_margin
        if cut.startswith("own"):  # ownX: X s of the window kept after the utterance
            margin = float(cut[3:] or margin)
            room = self.r.window([dataclasses.replace(utterance, left=None)]) - margin
        else:
            room = float(cut) - margin
        return context.filled(utterance, room)

    def left_prompt(self, track: Track, segs: list[Segment]) -> list[str]:
        return self.left(track, segs, prompted=True)

    @torch.inference_mode()
    def _one(
        self, audio: AudioArray, prompt: str = "", window: float | None = None, forced: str = ""
    ) -> str:
        """Greedy decoding of one utterance as the recognizer does it; `forced` text is
        fed after <|notimestamps|> and what follows it returned."""
        r = self.r
        if window is None and not forced:
            return r.transcribe([Utterance(audio, prompt=prompt)])[0].text
        utterance = Utterance(audio, prompt=prompt)
        window = window or r.whisper.encoders.for_duration(
            utterance.duration + r.config.window_margin
        )
        features = r.preprocess([utterance], window)
        hidden = r.whisper.encoders.encode(window, features)
        budget = token_budget(
            utterance.duration, r.config.max_tokens_per_second, r.whisper.max_new_tokens_cap
        )
        forced_ids = r.whisper.draft_tokens(forced)
        started = r.whisper.greedy.start(hidden, None, [r.whisper.prefix(prompt)])
        prompts = torch.tensor([[*r.whisper.prompt_tail, *forced_ids]], dtype=torch.long)
        greedy = r.whisper.greedy.decode(started, prompts, [budget])
        row = read_row(
            greedy.tokens[0].tolist(), greedy.logprobs[0], end_token=r.whisper.eot, budget=budget
        )
        return str(r.whisper.tokenizer.decode(row.tokens, skip_special_tokens=True)).strip()


def moved(word: WordTiming, seconds: float) -> WordTiming:
    return dataclasses.replace(word, start=word.start + seconds, end=word.end + seconds)


def wer(tracks: list[Track], texts: dict[str, list[str]]) -> ErrorCounts:
    total = ErrorCounts(0, 0, 0, 0)
    for track in tracks:
        total += error_counts(track.reference, " ".join(t for t in texts[track.id] if t))
    return total


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sets", nargs="+", default=["dialogue"], choices=list(SETS))
    parser.add_argument("--variants", nargs="+", default=["base"])
    parser.add_argument("--show", nargs="*", default=[], help="print these variants' finals")
    parser.add_argument("--pre-roll", type=float, default=0.2)
    parser.add_argument("--post-roll", type=float, default=0.1)
    parser.add_argument("--min-silence", type=float, default=0.5)
    parser.add_argument("--soft-max", type=float, default=8.0)
    parser.add_argument("--model", default="tiny.en", help="tiny.en, base, or a Whisper folder")
    parser.add_argument(
        "--context-window", type=float, default=WhisperRecognizerConfig().context_window,
        help="longest window a left context may fill (seconds, margin included)",
    )  # fmt: skip
    parser.add_argument(
        "--own-window", action="store_true",
        help="left context only in the room of the utterance's own window (cut at a word)",
    )  # fmt: skip
    parser.add_argument(
        "--encoder-dtype", choices=["float32", "bfloat16"], default="float32",
        help="the encoder's dtype (the server's default on a CPU with bfloat16: bfloat16)",
    )  # fmt: skip
    args = parser.parse_args()
    torch.set_num_threads(2)
    model_path = resolve_model(args.model, MODELS)
    recognizer = WhisperRecognizer(
        model_path,
        WhisperRecognizerConfig(
            context_window=args.context_window,
            context_own_window=args.own_window,
            encoder_dtype=args.encoder_dtype,
        ),
    )
    variants = Variants(recognizer, Offline(model_path))
    full_passes: list[int] = []  # rows decoded again on the full window (loops)
    forward = recognizer.forward

    def counted(
        batch: list[Utterance], window: float, should_stop: Callable[[], bool] | None = None
    ) -> list[Any]:
        if window == recognizer.whisper.encoders.full_window:
            full_passes.append(len(batch))
        return forward(batch, window, should_stop)

    recognizer.forward = counted  # type: ignore[method-assign,assignment]
    table: dict[str, Decode] = {
        "base": variants.base, "prompt": variants.prompt, "pad30": variants.pad30,
        "ts": variants.ts, "nots": variants.nots, "left": variants.left,
        "left+prompt": variants.left_prompt, "offline": variants.whole,
        "leftz": variants.left_zeros,
    }  # fmt: skip
    config = SegmenterConfig(
        pre_roll=args.pre_roll, post_roll=args.post_roll, min_silence=args.min_silence,
        soft_max_utterance=args.soft_max, partial_interval=0.0,
    )  # fmt: skip
    vad = SileroVad()
    for name in args.sets:
        tracks = SETS[name]()
        cut = {t.id: await segments(t, vad, config) for t in tracks}
        lengths = [(s.end - s.start) / SAMPLE_RATE for segs in cut.values() for s in segs]
        print(f"== {name}: {len(lengths)} utterances, {np.mean(lengths):.2f} s mean", flush=True)
        for variant in args.variants:
            if variant.startswith("roll+"):
                decode = variants.roll(float(variant[5:]))
            elif variant.startswith("ctx"):  # ctx, ctx@SECONDS, ctx+real, ctx@SECONDS+real
                name, _, fit = variant.partition("~")
                limit = float(name.split("@")[1].split("+")[0]) if "@" in name else 10.0
                count = int(name[3]) if name[3:4].isdigit() else 1
                decode = variants.ctx(
                    limit, name.endswith("+real"), count, name.endswith("+prompt"), fit
                )
            else:
                decode = table[variant]
            variants.windows.clear()
            variants.kept.clear()
            full_passes.clear()
            started = time.perf_counter()
            texts = {t.id: decode(t, cut[t.id]) for t in tracks}
            took = time.perf_counter() - started
            counts = wer(tracks, texts)
            windows = " ".join(
                f"{w:.0f}s:{variants.windows.count(w)}" for w in sorted(set(variants.windows))
            )
            print(
                f"  {variant:12s} WER {counts.rate:.4f} (S{counts.substitutions} "
                f"D{counts.deletions} I{counts.insertions} / {counts.reference_length}) "
                f"{took:.0f} s, {took / len(lengths) * 1000:.0f} ms an utterance"
                + (f", windows {windows}" if windows else "")
                + (f", context {np.mean(variants.kept):.1f} s mean" if variants.kept else "")
                + f", {sum(full_passes)} full-window passes",
                flush=True,
            )
            if variant in args.show:
                for t in tracks:
                    for s, text in zip(cut[t.id], texts[t.id], strict=False):
                        print(f"    {s.start / SAMPLE_RATE:7.2f}-{s.end / SAMPLE_RATE:7.2f} {text}")


if __name__ == "__main__":
    asyncio.run(main())
