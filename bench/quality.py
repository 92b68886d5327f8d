"""Transcript quality: streaming and file finals against offline decoding, prompts on and off.

    python -m bench.quality                         # every set, left context on and off
    python -m bench.quality --sets meeting --left 10 0 --prompts 0 128 --speed 4

Three sets, each a list of tracks (one audio source each, a reference text each):

- `corpus`: the 28 English corpus clips, one track each (the long-form clip included).
- `meeting`: one track of every English clip but the long-form one, in turns of distinct
  speakers (never the same reader twice in a row) with 0.3-1.5 s of silence between
  turns: about 3.5 minutes, built at run time.
- `dialogue`: a scripted meeting of three espeak-ng voices (`DIALOGUE`), rendered once
  into ~/.cache/parley/bench-quality (never into the repository), same gaps.

For each pair of `PARLEY_PROMPT_TOKENS` and `PARLEY_LEFT_CONTEXT_S` values it starts a
real server (`python -m server`) and sends every track through both paths: streamed over
the WebSocket at `--speed` x real time (partials and drafts on, as a client gets them)
and uploaded to `POST /v1/transcriptions` (the file path). Offline is the same tiny.en
weights decoding the whole track with transformers' long-form `generate()` in 30 s
windows with timestamps, greedy, each window conditioned on the previous text
(`condition_on_prev_tokens`, faster-whisper's default; no temperature fallback), and
without that condition for comparison. WER is corpus-level (`loadgen.wer`) over a set.

It also prints, per set and setting, the finals in all capitals beside finals that are
not (a source switching casing convention), and the cost per final: each turn decoded
alone on the recognizer, plain, with the previous turns' text as its prompt, and behind
the previous two turns (their audio, 0.5 s of silence after each and their text: the left
context).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import statistics
import subprocess
import time
import wave
from pathlib import Path
from typing import Any

import numpy as np
import soxr
import torch

from bench.capacity import scrape
from bench.corpus import clips
from engine.api import SAMPLE_RATE, AudioArray, LeftContext, Utterance
from engine.whisper.recognizer import WhisperRecognizer, WhisperRecognizerConfig
from engine.whisper.weights import resolve_model
from loadgen.wer import ErrorCounts, error_counts
from tests.support import audiofiles
from tests.support.httpclient import get, upload
from tests.support.servers import start_server
from tests.support.wsclient import stream_pcm

CACHE = Path.home() / ".cache" / "parley" / "bench-quality"
MODELS = Path.home() / ".cache" / "parley" / "models"
LONG_FORM = "en_lj_longform"
GAPS = (0.3, 1.5)

# (voice, line): a stand-up of three colleagues; names and terms recur, as in meetings.
DIALOGUE = [
    ("en-us+m3", "Good morning everyone. Let's start with the release status."),
    ("en-gb+f2", "Thanks Marcus. The release candidate passed every test last night."),
    ("en-029+m1", "Great. Did the database migration finish on the staging cluster?"),
    ("en-gb+f2", "It did, although it took almost two hours to copy the archive tables."),
    ("en-us+m3", "Two hours is too long. Can we split the archive into smaller batches?"),
    ("en-029+m1", "Yes, I can write a script that moves one month at a time."),
    ("en-gb+f2", "That would help. Priya also asked about the search index."),
    ("en-us+m3", "Right. The search index needs to be rebuilt after the migration."),
    ("en-029+m1", "I will schedule the rebuild for Thursday evening, when traffic is low."),
    ("en-gb+f2", "Please tell the support team before you start, so they can warn customers."),
    ("en-us+m3", "Good point. What about the new billing page?"),
    ("en-029+m1", "The billing page is ready, but the designers want to change the colors."),
    ("en-gb+f2", "Then let's ship it behind a feature flag and change the colors later."),
    ("en-us+m3", "Agreed. Marcus will turn on the flag for ten percent of users on Monday."),
    ("en-029+m1", "I can do that. Should we also watch the error rate on the dashboard?"),
    ("en-gb+f2", "Yes, and if the error rate doubles, turn the flag off immediately."),
    ("en-us+m3", "Perfect. Anything else before we finish?"),
    ("en-029+m1", "Only that I am on holiday next Friday, so Priya will cover for me."),
    ("en-gb+f2", "No problem. I will take the search index rebuild if it slips."),
    ("en-us+m3", "Thanks everyone. Let's meet again tomorrow at the same time."),
]


@dataclasses.dataclass(frozen=True, slots=True)
class Track:
    id: str
    audio: AudioArray
    reference: str
    turns: tuple[str, ...]  # each turn's reference, in order (cost per final)
    turn_audio: tuple[AudioArray, ...]

    @property
    def pcm16(self) -> bytes:
        return (np.clip(self.audio, -1, 1) * 32767).astype("<i2").tobytes()


def _silence(rng: random.Random) -> AudioArray:
    return np.zeros(round(rng.uniform(*GAPS) * SAMPLE_RATE), np.float32)


def _in_turns(pieces: list[tuple[str, AudioArray, str]], rng: random.Random, name: str) -> Track:
    """One track of (speaker, audio, text) turns with gaps; half a second around it."""
    lead = np.zeros(SAMPLE_RATE // 2, np.float32)
    audio = [lead]
    for _, piece, _ in pieces:
        audio += [piece, _silence(rng)]
    turns = tuple(text for _, _, text in pieces)
    turn_audio = tuple(piece for _, piece, _ in pieces)
    return Track(name, np.concatenate([*audio, lead]), " ".join(turns), turns, turn_audio)


def corpus_set() -> list[Track]:
    tracks = []
    for clip in clips(("en_",)):
        audio = clip.audio()
        tracks.append(Track(clip.id, audio, clip.reference, (clip.reference,), (audio,)))
    return tracks


def meeting_set(seed: int = 17) -> list[Track]:
    """Every English clip but the long-form one, never one reader twice in a row."""
    rng = random.Random(seed)
    remaining = [c for c in clips(("en_",)) if not c.id.startswith(LONG_FORM)]
    rng.shuffle(remaining)
    speaker = {c.id: c.id.rsplit("_", 1)[0] if "_lj_" in c.id else c.id[:10] for c in remaining}
    order: list[Any] = []
    while remaining:
        counts: dict[str, int] = {}
        for c in remaining:
            counts[speaker[c.id]] = counts.get(speaker[c.id], 0) + 1
        last = speaker[order[-1].id] if order else None
        allowed = [c for c in remaining if speaker[c.id] != last] or remaining
        pick = max(allowed, key=lambda c: counts[speaker[c.id]])
        order.append(pick)
        remaining.remove(pick)
    pieces = [(speaker[c.id], c.audio(), c.reference) for c in order]
    return [_in_turns(pieces, rng, "meeting")]


def dialogue_set(seed: int = 5) -> list[Track]:
    rng = random.Random(seed)
    CACHE.mkdir(parents=True, exist_ok=True)
    pieces = []
    for i, (voice, line) in enumerate(DIALOGUE):
        path = CACHE / f"dialogue-{i:02d}-{voice}.wav"
        if not path.exists():
            subprocess.run(
                ["espeak-ng", "-v", voice, "-s", "165", "-w", str(path), line], check=True
            )
        with wave.open(str(path), "rb") as wav:
            rate = wav.getframerate()
            pcm = np.frombuffer(wav.readframes(wav.getnframes()), "<i2")
        audio = soxr.resample(pcm.astype(np.float32) / 32768, rate, SAMPLE_RATE)
        pieces.append((voice, audio.astype(np.float32), line))
    return [_in_turns(pieces, rng, "dialogue")]


SETS = {"corpus": corpus_set, "meeting": meeting_set, "dialogue": dialogue_set}


# ------------------------------------------------------------------ offline


class Offline:
    """tiny.en's own long-form decoding: 30 s windows, timestamps, greedy."""

    def __init__(self, model_path: Path) -> None:
        from transformers import WhisperForConditionalGeneration, WhisperProcessor

        self.model = WhisperForConditionalGeneration.from_pretrained(
            model_path, dtype=torch.float32
        )
        torch.nn.Module.eval(self.model)
        self.processor = WhisperProcessor.from_pretrained(model_path)

    @torch.inference_mode()
    def transcribe(self, audio: AudioArray, condition: bool) -> str:
        long = len(audio) > 30 * SAMPLE_RATE
        inputs = self.processor(
            audio,
            sampling_rate=SAMPLE_RATE,
            return_tensors="pt",
            return_attention_mask=True,
            **({"truncation": False, "padding": "longest"} if long else {}),
        )
        tokens = self.model.generate(
            **inputs, return_timestamps=True, condition_on_prev_tokens=condition
        )
        decoded = self.processor.batch_decode(tokens, skip_special_tokens=True)  # type: ignore[no-untyped-call]
        return str(decoded[0]).strip()


# ------------------------------------------------------------------ server paths


@dataclasses.dataclass
class Paths:
    """What one server setting made of a set: per track, streamed and uploaded finals."""

    streamed: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    uploaded: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    inference: list[float] = dataclasses.field(default_factory=list)  # streamed finals'
    total: list[float] = dataclasses.field(default_factory=list)  # their close → sent
    contexts_shed: float = 0.0  # live finals the load gate decoded without their context
    upload_seconds: float = 0.0  # wall time of all uploads, one after another


async def _stream(base: str, track: Track, speed: float, paths: Paths) -> None:
    result = await stream_pcm(
        base.replace("http", "ws"), f"q-{time.time_ns()}", track.pcm16, speed=speed,
        trailing_silence=1.0, drain_timeout=600,
    )  # fmt: skip
    paths.streamed[track.id] = [f["text"] for f in result.finals]
    paths.inference += [f["timing"]["inference"] for f in result.finals if "timing" in f]
    paths.total += [f["timing"]["total"] for f in result.finals if "timing" in f]


async def _upload(base: str, track: Track, paths: Paths) -> None:
    wav = audiofiles.wav_header(SAMPLE_RATE, len(track.pcm16)) + track.pcm16
    response = await upload(base, wav, f"{track.id}.wav", params={"wait": "true"}, timeout=900)
    job = response.json()
    while job["status"] not in {"done", "failed"}:
        await asyncio.sleep(0.5)
        job = (await get(f"{base}/v1/transcriptions/{job['id']}")).json()
    if job["status"] != "done":
        raise RuntimeError(f"upload of {track.id} failed: {job}")
    paths.uploaded[track.id] = [u["text"] for u in job["result"]["utterances"]]


async def serve(
    tracks: list[Track], prompt_tokens: int, left: float, speed: float, streams: int
) -> Paths:
    env = {
        "PARLEY_PROMPT_TOKENS": str(prompt_tokens),
        "PARLEY_LEFT_CONTEXT_S": str(left),
        "PARLEY_DIARIZATION": "false",
    }
    server = await asyncio.to_thread(start_server, env)
    paths = Paths()
    try:
        room = asyncio.Semaphore(streams)

        async def one(track: Track) -> None:
            async with room:
                await _stream(server.http_url, track, speed, paths)

        await asyncio.gather(*(one(track) for track in tracks))
        shed = (await asyncio.to_thread(scrape, server.http_url)).get("parley_contexts_shed_total")
        paths.contexts_shed = shed or 0.0
        started = time.perf_counter()
        for track in tracks:
            await _upload(server.http_url, track, paths)
        paths.upload_seconds = time.perf_counter() - started
    finally:
        server.stop()
    return paths


# ------------------------------------------------------------------ figures


def wer(tracks: list[Track], texts: dict[str, str]) -> ErrorCounts:
    total = ErrorCounts(0, 0, 0, 0)
    for track in tracks:
        total += error_counts(track.reference, texts[track.id])
    return total


def caps_switches(finals: dict[str, list[str]]) -> int:
    """Finals in all capitals from sources whose other finals are not."""

    def shouting(text: str) -> bool:
        letters = [c for c in text if c.isalpha()]
        return len(letters) >= 2 and all(c.isupper() for c in letters)

    count = 0
    for texts in finals.values():
        loud = sum(shouting(t) for t in texts)
        if loud < len(texts):
            count += loud
    return count


def cost_per_final(model_path: Path, track: Track) -> str:
    """Each turn alone (batch 1): plain, after the previous turns' text, and behind the
    previous turn (left context): mean ms."""
    turns, audio = track.turns, track.turn_audio
    recognizer = WhisperRecognizer(model_path, WhisperRecognizerConfig(prompt_tokens=128))
    recognizer.warmup()
    gap = np.zeros(SAMPLE_RATE // 2, np.float32)
    timings: dict[str, list[float]] = {"plain": [], "prompt": [], "left": []}
    for i, piece in enumerate(audio):
        before = range(max(0, i - 2), i)  # the server's default: up to two turns
        left = (
            LeftContext(
                np.concatenate([x for k in before for x in (audio[k], gap)]),
                " ".join(turns[k] for k in before),
            )
            if i
            else None
        )
        ways = {
            "plain": Utterance(piece),
            "prompt": Utterance(piece, prompt=" ".join(turns[:i])[-1000:]),
            "left": Utterance(piece, left=left),
        }
        for way, utterance in ways.items():
            started = time.perf_counter()
            recognizer.transcribe([utterance])
            timings[way].append(time.perf_counter() - started)
    plain, prompt, left_ms = (statistics.mean(timings[k]) * 1000 for k in timings)
    return (
        f"{plain:.0f} ms plain, {prompt:.0f} ms with a prompt (+{prompt / plain - 1:.0%}), "
        f"{left_ms:.0f} ms with left context (+{left_ms / plain - 1:.0%})"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sets", nargs="+", default=list(SETS), choices=list(SETS))
    parser.add_argument("--prompts", nargs="+", type=int, default=[0], metavar="TOKENS")
    parser.add_argument("--left", nargs="+", type=float, default=[10.0, 0.0], metavar="SECONDS")
    parser.add_argument("--no-offline", action="store_true", help="skip offline decoding")
    parser.add_argument("--speed", type=float, default=4.0, help="streaming x real time")
    parser.add_argument("--streams", type=int, default=4, help="tracks streamed at once")
    parser.add_argument("--cost", action="store_true", help="time finals with/without prompt")
    parser.add_argument("--show", action="store_true", help="print every streamed final")
    args = parser.parse_args()
    model_path = resolve_model("tiny.en", MODELS)
    offline = Offline(model_path)
    for name in args.sets:
        tracks = SETS[name]()
        seconds = sum(len(t.audio) for t in tracks) / SAMPLE_RATE
        print(f"\n== {name}: {len(tracks)} tracks, {seconds:.0f} s of audio", flush=True)
        for condition in () if args.no_offline else (True, False):
            started = time.perf_counter()
            texts = {t.id: offline.transcribe(t.audio, condition) for t in tracks}
            label = "conditioned on previous text" if condition else "without previous text"
            took = time.perf_counter() - started
            print(f"  offline, {label}: WER {wer(tracks, texts).rate:.4f} ({took:.0f} s)")
        for tokens, left in [(t, s) for t in args.prompts for s in args.left]:
            paths = await serve(tracks, tokens, left, args.speed, args.streams)
            for path, finals in (("streaming", paths.streamed), ("file", paths.uploaded)):
                texts = {k: " ".join(v) for k, v in finals.items()}
                print(
                    f"  {path:9s} PROMPT_TOKENS={tokens:<3d} LEFT_CONTEXT_S={left:<4g}: "
                    f"WER {wer(tracks, texts).rate:.4f}, "
                    f"{sum(map(len, finals.values()))} finals, "
                    f"{caps_switches(finals)} all-caps among sentence-case",
                    flush=True,
                )
            if args.show:
                for track_id, said in paths.streamed.items():
                    print(f"    {track_id}:", *(f"      {text}" for text in said), sep="\n")
            inference = statistics.mean(paths.inference) if paths.inference else 0.0
            total = np.percentile(paths.total, 95) if paths.total else 0.0
            print(
                f"    streamed finals' mean inference {inference:.3f} s, close → sent P95 "
                f"{total:.2f} s, {paths.contexts_shed:g} contexts shed; "
                f"uploads took {paths.upload_seconds:.1f} s",
                flush=True,
            )
        if args.cost and len(tracks) == 1:
            cost = cost_per_final(model_path, tracks[0])
            print(f"  cost per final ({len(tracks[0].turns)} turns): {cost}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
