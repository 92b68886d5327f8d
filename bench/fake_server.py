"""`python -m bench.fake_server`: the Parley server exactly as `python -m server` runs it
(same settings, uvicorn config, store, VAD, scheduler, drain), with a stand-in for the
speech model that takes a set time per batch.

For benchmarks of everything but the model (faults, leaks, the front end's CPU, the
scheduler's policy on a GPU's costs) on a machine whose CPU cannot run the real model for
many rooms: the model's time is simulated with a sleep on the scheduler's worker thread
(which holds no GIL, as a GPU's kernels do not), stopped at the next 5 ms when the
scheduler says stop, as the real decoder stops at its next step. A batch of n takes
`PARLEY_FAKE_BATCH_MS` + n x `PARLEY_FAKE_UTTERANCE_MS`, or, with
`PARLEY_FAKE_BATCH_TABLE` (`size:ms,...`), the table's time interpolated linearly between
its sizes (beyond its ends: the end's time per row). `H200_TINY_EN` is one NVIDIA H200's
tiny.en float16 row (docs/history/2026-12-04-gpu-h200.md):

    PARLEY_FAKE_BATCH_TABLE=1:138,2:109,4:104,8:121,16:134,32:195,64:353 \\
        PARLEY_MODEL_WORKERS=1 python -m bench.fake_server --port 8000

Each text is `n=<samples>`, so a transcript says which audio it covers.
"""

from __future__ import annotations

import os
import sys

from bench.fake_recognizer import FakeRecognizer, batch_table
from server.__main__ import main
from server.settings import Settings

H200_TINY_EN = "1:138,2:109,4:104,8:121,16:134,32:195,64:353"


def timed_recognizer(settings: Settings) -> FakeRecognizer:
    table = os.environ.get("PARLEY_FAKE_BATCH_TABLE")
    return FakeRecognizer(
        batch_s=float(os.environ.get("PARLEY_FAKE_BATCH_MS", "30")) / 1000,
        utterance_s=float(os.environ.get("PARLEY_FAKE_UTTERANCE_MS", "10")) / 1000,
        table=batch_table(table) if table else (),
        record=False,
    )


if __name__ == "__main__":
    sys.exit(main(recognizer=timed_recognizer))
