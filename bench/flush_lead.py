"""Which flushes of `bench.ttfs` wait for a decode, and why: offline, clip by clip.

    python -m bench.flush_lead                   # the 27 clips of `bench.ttfs --clips 27`
    python -m bench.flush_lead --clips 5 --repeat 1

A flush is answered at once only if the final it cuts was speculated early enough: TTFS
(bench/ttfs.py) is 0.2 s plus what the server takes after the client's Finalize, and a
speculation made `lead` seconds before that Finalize is ready then if it decodes within
`lead`. For each clip's last Finalize (the one its TTFS is read at), this bench runs, with
no server and no clock, what the live path runs on the same audio: the client's VAD
(pipecat's, `bench.ttfs.vad_stops`), the server's VAD and segmenter (its default settings)
with their `UtteranceMayEnd` / `UtteranceResumed` events, and the partials (decoded as they
come due, each drafted by the one before; one due less than `--partial-ms` before the
speculation is still running then and is cancelled, so it drafts nothing). It reports
whether a speculation is held at the Finalize and how long before it it was made (its
lead), and decodes that speculation as a model worker does a final (one torch thread, its
latest partial's text as the draft, word timings), `--repeat` times: the least CPU time
(`time.thread_time`, which a busy box stretches least) and the decoder passes.

A clip with no speculation held is decoded at its flush (`decoded` in `bench.ttfs`); one
whose CPU time exceeds its lead by more than ~80 ms is in the TTFS tail.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bench.ttfs import RATE, VadParams, vad_stops
from engine.api import Utterance
from engine.loading import load_whisper
from engine.recognizer import Recognizer
from engine.whisper.decoder_step import DecoderStep
from loadgen.audio import load_audio
from loadgen.corpus import Clip, default_corpus_dir, load_manifest, select_clips
from server.app import segmenter_config
from server.engine_plan import model_config
from server.settings import Settings
from session.segmenter import PartialDue, Segmenter, UtteranceMayEnd, UtteranceResumed
from session.vad import WINDOW, SileroVad, VadState


@dataclass(frozen=True, slots=True)
class LastFlush:
    clip: str
    speculation: Utterance | None  # held at the last Finalize, as the live path builds it
    lead: float  # seconds from its UtteranceMayEnd to the Finalize (0 if none)


def last_flush(clip: Clip, recognizer: Recognizer, partial_ms: float) -> LastFlush:
    """The speculation held at `clip`'s last Finalize (after 1 s of silence, as in
    `bench.ttfs`), and its lead."""
    pcm = np.concatenate([load_audio(clip.path), np.zeros(RATE, np.int16)])
    samples = pcm.astype(np.float32) / np.float32(32768)
    finalize_at = vad_stops(samples, VadParams())[-1]
    segmenter, vad, state = Segmenter(segmenter_config(Settings())), SileroVad(), VadState()
    partials: dict[int, list[tuple[int, str]]] = {}  # index -> (due at, text)
    held: tuple[UtteranceMayEnd, int] | None = None
    for i in range(finalize_at // WINDOW):
        window = samples[i * WINDOW : (i + 1) * WINDOW]
        now = (i + 1) * WINDOW
        for event in segmenter.push(window, float(vad.score(window[None, :], [state])[0])):
            if isinstance(event, PartialDue):
                before = partials.get(event.index, [])
                draft = before[-1][1] if before else ""
                partial = Utterance(event.audio, "en", draft, "", partial=True)
                text = recognizer.transcribe([partial])[0].text
                partials.setdefault(event.index, []).append((now, text))
            elif isinstance(event, UtteranceMayEnd):
                held = (event, now)
            elif isinstance(event, UtteranceResumed):
                held = None
    if held is None:
        return LastFlush(clip.id, None, 0.0)
    event, made_at = held
    done = [
        text
        for due, text in partials.get(event.index, [])
        if made_at - due >= partial_ms * RATE / 1000
    ]
    draft = done[-1] if done else ""
    speculation = Utterance(event.audio, "en", draft, "", word_timings=True)
    return LastFlush(clip.id, speculation, (finalize_at - made_at) / RATE)


@contextmanager
def counted_passes() -> Iterator[list[int]]:
    """Counts `DecoderStep.feed` calls (decoder passes) inside the block."""
    passes = [0]
    feed = DecoderStep.feed

    def counting(self: DecoderStep, *args: object, **kwargs: object) -> torch.Tensor:
        passes[0] += 1
        return feed(self, *args, **kwargs)  # type: ignore[arg-type]

    DecoderStep.feed = counting  # type: ignore[method-assign]
    try:
        yield passes
    finally:
        DecoderStep.feed = feed  # type: ignore[method-assign]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clips", type=int, default=27, help="first N English corpus clips")
    parser.add_argument("--repeat", type=int, default=3, help="decodes of each speculation")
    parser.add_argument("--partial-ms", type=float, default=100.0, help="a partial's decode")
    parser.add_argument("--corpus", default=str(default_corpus_dir()))
    args = parser.parse_args(argv)
    recognizer = load_whisper(model_config(Settings()))
    torch.set_num_threads(1)  # what each CPU model worker has (engine/loading.py worker_plan)
    recognizer.warmup()
    clips = select_clips(load_manifest(Path(args.corpus)), "en", 30.0)[: args.clips]
    print("| clip | audio | lead | draft → final words | passes | CPU ms | over the lead |")
    print("|---|---|---|---|---|---|---|")
    over: list[float] = []
    for clip in clips:
        flush = last_flush(clip, recognizer, args.partial_ms)
        if flush.speculation is None:
            print(f"| {clip.id} | – | none held: decoded at the flush | | | | |", flush=True)
            continue
        cpu = []
        for _ in range(args.repeat):
            with counted_passes() as passes:
                started = time.thread_time()
                text = recognizer.transcribe([flush.speculation])[0].text
                cpu.append(time.thread_time() - started)
        seconds = len(flush.speculation.audio) / RATE
        words = f"{len(flush.speculation.draft.split())} → {len(text.split())}"
        over.append(min(cpu) - flush.lead)
        print(
            f"| {clip.id} | {seconds:.1f} s | {flush.lead * 1000:.0f} ms | {words} | {passes[0]} "
            f"| {min(cpu) * 1000:.0f} | {over[-1] * 1000:+.0f} ms |",
            flush=True,
        )
    late = sorted(over)
    print(f"\nCPU time over the lead, sorted (ms): {[round(x * 1000) for x in late]}")


if __name__ == "__main__":
    main()
