"""Parley's test suite.

Idle OpenMP threads wait passively here. `make test` runs two test files at once, so a
file's torch threads share the cores with the other file and its servers; by default each
idle OpenMP thread spins for its next parallel region, burning the time the other file
needs (docs/history/2026-12-07-suite-time.md). Set before anything imports torch: the
conftest beside this file does.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
