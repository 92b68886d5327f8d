"""The browser client's pure JavaScript (resampler, exports, protocol helpers, models),
tested by node's built-in runner: `node --test static/tests/`."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.support.corpus import REPO


def test_static_js_unit_tests_pass() -> None:
    """node --test static/tests/ passes (resampler anti-aliasing, SRT/VTT, reconnect rules)."""
    node = shutil.which("node") or shutil.which("nodejs")
    if node is None:
        pytest.skip("node is not installed (apt-get install -y nodejs)")
    files = sorted(str(p.relative_to(REPO)) for p in (REPO / "static" / "tests").glob("*.test.js"))
    assert files, "no static/tests/*.test.js"
    result = subprocess.run(
        [node, "--test", *files],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
