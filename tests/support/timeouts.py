"""The one timeout scale of the suite, as websockets' test utilities have it: every wait a
test allows is a multiple of `MS` (or of `S`, a thousand of them), so a slower machine
raises one number, PARLEY_TESTS_TIMEOUT_FACTOR, instead of fourteen files' own.

A timeout is how long a test waits before it calls a thing broken, never the behaviour
under test: a server's idle timeout or a lease is a setting, not a multiple of `MS`.
"""

from __future__ import annotations

import os

MS = 0.001 * float(os.environ.get("PARLEY_TESTS_TIMEOUT_FACTOR", "1"))
S = 1000 * MS

# What the tests wait for, named once.
START_TIMEOUT = 300 * S  # a server's readiness: its first start converts the bundled weights
REPLY_TIMEOUT = 10 * S  # one HTTP request or control reply of a ready server
EVENT_TIMEOUT = 5 * S  # a fake engine's result: milliseconds of work, seconds on a loaded box
