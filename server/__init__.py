"""Parley's server: routes, settings, process start-up."""

import os

# One BLAS thread per calling thread, set before numpy loads OpenBLAS. Otherwise every
# numpy matrix product (speaker embeddings' mel spectra, re-clustering) starts a thread
# per core that spins beside the model workers, which already use every core: embedding
# took over twice the process's CPU with OpenBLAS's default threads
# (docs/history/2026-12-01-diarization.md#diarization-speaker-labels). An operator's own
# setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
