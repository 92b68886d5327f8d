"""The browser client's pure JavaScript (resampler, exports, protocol helpers, models),
tested by node's built-in runner: `node --test server/static/tests/`."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.support.corpus import REPO


def test_static_js_unit_tests_pass() -> None:
    """node --test server/static/tests/ passes (resampler anti-aliasing, SRT/VTT, reconnects)."""
    node = shutil.which("node") or shutil.which("nodejs")
    if node is None:
        pytest.skip("node is not installed (apt-get install -y nodejs)")
    tests = REPO / "server" / "static" / "tests"
    files = sorted(str(p.relative_to(REPO)) for p in tests.glob("*.test.js"))
    assert files, "no server/static/tests/*.test.js"
    result = subprocess.run(
        [node, "--test", *files],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
