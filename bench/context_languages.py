"""Left context beyond English: the corpus's non-English clips on Whisper base.

    python -m bench.context_languages            # every non-English clip
    python -m bench.context_languages --show     # and every variant's text

Each clip is cut as the file path cuts it (Silero VAD, the server's default segmenter,
`bench.segments`), then decoded one utterance at a time (batch 1): `plain` (each on its
own, the first detecting the language, the rest pinned to it), `ctxN` (behind the
previous utterances that fit N seconds, as the committer builds their context:
`session.said_before`) and `whole` (the clip in one window: what offline decoding
hears). Error rates are corpus-level: WER over the word languages, CER over zh/ja/ko
(`loadgen.wer`).
"""

from __future__ import annotations

import argparse
import asyncio

import torch

from bench.corpus import clips
from bench.quality import MODELS
from bench.segments import segments
from engine.api import SAMPLE_RATE, AudioArray, Utterance
from engine.whisper.recognizer import WhisperRecognizer, WhisperRecognizerConfig
from engine.whisper.weights import resolve_model
from loadgen.wer import CHARACTER_LANGUAGES, ErrorCounts, error_counts
from session.said_before import SaidBefore
from session.segmenter import SegmenterConfig
from session.vad import SileroVad

LIMITS = {"plain": 0.0, "ctx10": 10.0, "ctx20": 20.0}


class _Track:
    def __init__(self, audio: AudioArray) -> None:
        self.audio = audio


def decode(
    recognizer: WhisperRecognizer, audio: AudioArray, cuts: list[tuple[int, int]], limit: float
) -> str:
    """The clip's utterances one by one, each behind at most `limit` s of context."""
    said = SaidBefore()
    texts: list[str] = []
    language: str | None = None
    for index, (start, end) in enumerate(cuts):
        left = said.before(index, start, limit) if limit else None
        result = recognizer.transcribe([Utterance(audio[start:end], language, left=left)])[0]
        language = language or result.language
        texts.append(result.text)
        if result.text:
            said.add(index, start, end, audio[start:end], result.text)
        else:
            said.clear()
    return " ".join(text for text in texts if text)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="base")
    parser.add_argument("--show", action="store_true", help="print every variant's text")
    args = parser.parse_args()
    torch.set_num_threads(2)
    vad = SileroVad()
    torch.set_num_threads(2)  # importing silero_vad sets it to 1
    recognizer = WhisperRecognizer(
        resolve_model(args.model, MODELS), WhisperRecognizerConfig(word_timings=False)
    )
    totals = {v: [ErrorCounts(0, 0, 0, 0), ErrorCounts(0, 0, 0, 0)] for v in [*LIMITS, "whole"]}
    for clip in (c for c in clips() if c.language != "en"):
        audio = clip.audio()
        cut = await segments(_Track(audio), vad, SegmenterConfig())  # type: ignore[arg-type]
        cuts = [(s.start, s.end) for s in cut]
        texts = {name: decode(recognizer, audio, cuts, limit) for name, limit in LIMITS.items()}
        if len(audio) < 29 * SAMPLE_RATE:
            texts["whole"] = recognizer.transcribe([Utterance(audio)])[0].text
        kind = int(clip.language in CHARACTER_LANGUAGES)
        rates = []
        for name, text in texts.items():
            counts = error_counts(clip.reference, text, clip.language)
            totals[name][kind] += counts
            rates.append(f"{name} {counts.rate:.3f}")
        print(f"{clip.id:30s} {clip.language} {len(cuts)} utterances: {', '.join(rates)}")
        if args.show:
            for name, text in texts.items():
                print(f"    {name:6s} {text}")
    for name, (words, characters) in totals.items():
        print(f"{name:6s} WER {words.rate:.4f}  CER {characters.rate:.4f}")


if __name__ == "__main__":
    asyncio.run(main())
