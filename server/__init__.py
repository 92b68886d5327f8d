"""Parley's server: routes, settings, process start-up."""

import os

# One BLAS thread per calling thread, set before numpy loads OpenBLAS. Otherwise every
# numpy matrix product (speaker embeddings' mel spectra, re-clustering) starts a thread
# per core that spins beside the model workers, which already use every core: embedding
# took over twice the process's CPU with OpenBLAS's default threads
# (docs/history/2026-12-01-diarization.md#diarization-speaker-labels). An operator's own
# setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# oneDNN (the bfloat16 encoder's kernels) keeps a JIT-compiled kernel per shape it has met,
# up to 1,024 by default: a model worker's memory grew ~80 MiB as a day's shapes (batch
# rows, encoder windows) filled it. 16 bounds it within minutes at no measured cost in
# speed (`python -m bench.worker_memory`, docs/history/2026-12-07-worker-memory.md). Read
# when oneDNN first runs: the server and its model workers (spawned with this
# environment) inherit it. An operator's own setting wins.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16")
