"""The browser client's folder: found from any working directory, or said to be missing."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from server.app import PACKAGE, browser_client_dir
from tests.support.servers import start_server


def test_the_page_is_served_when_the_server_starts_in_another_folder(tmp_path: Path) -> None:
    """`make run`'s default (`static`, relative) from a folder with no `static/` in it: the
    real server still serves the page, from the installed package."""
    assert not (tmp_path / "static").exists()
    server = start_server({"PARLEY_STATIC_DIR": "static"}, cwd=tmp_path)
    try:
        status, body = server.get("/")
        assert status == 200
        assert b"<title>Parley" in body
        status, script = server.get("/protocol.js")
        assert status == 200 and script == (PACKAGE / "static" / "protocol.js").read_bytes()
    finally:
        server.stop()


def test_the_working_directory_comes_first_and_a_missing_folder_is_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    own = tmp_path / "static"
    own.mkdir()
    monkeypatch.chdir(tmp_path)
    assert browser_client_dir("static") == Path("static")  # the working directory's own
    assert browser_client_dir(str(own)) == own
    with caplog.at_level(logging.WARNING, logger="server.app"):
        assert browser_client_dir(str(tmp_path / "nowhere")) is None
        assert browser_client_dir("nowhere") is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2 and all("PARLEY_STATIC_DIR" in w for w in warnings)
    assert str(PACKAGE / "nowhere") in warnings[1]
