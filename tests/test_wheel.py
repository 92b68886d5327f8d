"""A built wheel carries the whole product: installed (not editable), `python -m server`
started from an empty folder serves the browser page it ships."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.corpus import REPO
from tests.support.servers import start_server

PAGE = ("index.html", "app.js", "protocol.js", "styles.css", "capture-worklet.js")


def build_wheel(folder: Path) -> Path:
    """`pip wheel .` of a copy of the checkout (the build leaves build/ and *.egg-info
    behind), without its dependencies (they are installed here)."""
    source = folder / "source"
    skip = (".*", "tests", "bench", "docs", "deploy", "samples", "reports", "build", "dist")
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*skip, "*.egg-info", "__pycache__"))
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q", "-w", folder, "."],
        cwd=source,
        check=True,
        timeout=300,
        capture_output=True,
    )
    (wheel,) = folder.glob("parley-*.whl")
    return wheel


@pytest.mark.slow
def test_an_installed_wheel_serves_the_page_from_any_folder(tmp_path: Path) -> None:
    """The wheel holds server/static/ (not its node tests); installed into a folder of its
    own and started from an empty one, the server serves that copy's page at `/`."""
    wheel = build_wheel(tmp_path / "wheel")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"server/static/{name}" for name in PAGE} <= names
    assert not [n for n in names if n.startswith("server/static/tests/") or "package.json" in n]

    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", site, wheel],
        check=True,
        timeout=300,
        capture_output=True,
    )
    # A mark in the installed copy only: the page served must be the installed one.
    index = site / "server" / "static" / "index.html"
    index.write_text(index.read_text(encoding="utf-8") + "<!-- installed copy -->\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {"PYTHONPATH": str(site), "PARLEY_STATIC_DIR": "static", "PARLEY_DIARIZATION": "false"}
    where = subprocess.run(
        [sys.executable, "-c", "import server; print(server.__file__)"],
        cwd=empty,
        env={**os.environ, **env},
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(site), where

    server = start_server(env, cwd=empty)
    try:
        status, body = server.get("/")
        assert status == 200 and b"<title>Parley" in body
        assert b"<!-- installed copy -->" in body
        status, script = server.get("/protocol.js")
        assert status == 200 and script == (site / "server" / "static" / "protocol.js").read_bytes()
    finally:
        server.stop()
