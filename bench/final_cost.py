"""What one final costs the model worker that decodes it, and where the time goes.

    python -m bench.final_cost                  # 16 English corpus clips of 1.5-12 s
    python -m bench.final_cost --clips 8 --profile 0

A flush answered from a speculation is as fast as the speculation's decode
(docs/performance.md#a-flush-answered-from-a-speculation-benchttfs): this bench decodes each
clip as the server's model worker does a final (the server's default model settings, one
torch thread, batch 1, with words), with the text of a partial of its first 85 % as the
draft (the latest partial a session holds when speech stops), and without the draft or the
words for comparison. It reports CPU time (`time.thread_time`), which a busy machine
stretches less than wall time (though not to nothing: a busy sibling hyperthread slows
it too), and with `--profile N` the N costliest functions of engine/
under cProfile.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections.abc import Sequence

import torch

from bench.corpus import clips
from engine.api import SAMPLE_RATE, AudioArray, Utterance
from engine.loading import load_whisper
from engine.recognizer import Recognizer
from server.engine_plan import model_config
from server.settings import Settings

DRAFT_SHARE = 0.85  # of a clip, heard by its latest partial


def cost_ms(recognizer: Recognizer, items: list[tuple[AudioArray, str]], words: bool) -> float:
    """Mean CPU ms per final over `items` (audio, draft), decoded one by one."""
    started = time.thread_time()
    for audio, draft in items:
        recognizer.transcribe([Utterance(audio, draft=draft, word_timings=words)])
    return (time.thread_time() - started) / len(items) * 1000


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clips", type=int, default=16, help="English corpus clips of 1.5-12 s")
    parser.add_argument("--profile", type=int, default=25, help="functions to list (0: none)")
    args = parser.parse_args(argv)

    recognizer = load_whisper(model_config(Settings()))
    torch.set_num_threads(1)  # what each CPU model worker has (engine/loading.py worker_plan)
    recognizer.warmup()
    audio = [
        a for a in (clip.audio() for clip in clips(("en_",))) if 1.5 < len(a) / SAMPLE_RATE < 12
    ][: args.clips]
    partials = recognizer.transcribe(
        [Utterance(a[: int(len(a) * DRAFT_SHARE)], partial=True) for a in audio]
    )
    drafted = [(a, p.text) for a, p in zip(audio, partials, strict=True)]
    plain = [(a, "") for a in audio]
    seconds = sum(len(a) for a in audio) / SAMPLE_RATE / len(audio)
    print(f"{len(audio)} clips, {seconds:.1f} s of audio each on average; CPU ms per final:")
    print("| final | CPU ms |\n|---|---|")
    for name, items, words in (
        ("with words, the partial's draft (a speculation)", drafted, True),
        ("without words, the partial's draft", drafted, False),
        ("with words, no draft", plain, True),
    ):
        print(f"| {name} | {cost_ms(recognizer, items, words):.0f} |")
    if args.profile:
        profile = cProfile.Profile(time.thread_time)
        profile.enable()
        cost_ms(recognizer, drafted, True)
        profile.disable()
        pstats.Stats(profile).sort_stats("cumulative").print_stats(r"engine", args.profile)


if __name__ == "__main__":
    main()
