"""`python -m bench.fake_server`: the Parley server exactly as `python -m server` runs it
(same settings, uvicorn config, store, VAD, scheduler, drain), with a stand-in for the
speech model that takes a fixed time per batch.

For benchmarks of everything but the model (faults, leaks) on a machine whose CPU cannot
run the real model for many rooms: the model's time is simulated with a sleep on the
scheduler's worker thread (`PARLEY_FAKE_BATCH_MS` + `PARLEY_FAKE_UTTERANCE_MS` per
utterance), and each text is `n=<samples>`, so a transcript says which audio it covers.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence

from engine.api import Transcription, Utterance
from server.__main__ import main
from server.settings import Settings


class TimedRecognizer:
    """Transcribes an utterance as `n=<sample count>` after a simulated model time."""

    def __init__(self, batch_s: float, utterance_s: float, max_batch_size: int) -> None:
        self._batch_s = batch_s
        self._utterance_s = utterance_s
        self._max_batch_size = max_batch_size

    @property
    def name(self) -> str:
        return "fake"

    @property
    def max_batch_size(self) -> int:
        return self._max_batch_size

    @property
    def languages(self) -> frozenset[str]:
        return frozenset({"en"})

    def warmup(self) -> None:
        return None

    def transcribe(
        self, batch: Sequence[Utterance], should_stop: Callable[[], bool] | None = None
    ) -> list[Transcription]:
        time.sleep(self._batch_s + self._utterance_s * len(batch))
        return [
            Transcription(
                text=f"n={len(u.audio)}",
                language="en",
                avg_logprob=-0.1,
                no_speech_prob=0.0,
                language_probability=None,
            )
            for u in batch
        ]


def timed_recognizer(settings: Settings) -> TimedRecognizer:
    return TimedRecognizer(
        float(os.environ.get("PARLEY_FAKE_BATCH_MS", "30")) / 1000,
        float(os.environ.get("PARLEY_FAKE_UTTERANCE_MS", "10")) / 1000,
        settings.scheduler.max_batch_size,
    )


if __name__ == "__main__":
    sys.exit(main(recognizer=timed_recognizer))
