"""The browser client against a server with authentication on: the page gets a fresh
meeting token for every connection from the embedding application's backend
(`?token_url=`), passes it as a WebSocket subprotocol, and transcribes as usual."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from loadgen.wer import error_rate
from tests.support.corpus import clip
from tests.support.redis_support import free_port
from tests.support.servers import ServerProcess, start_server

pytestmark = pytest.mark.slow

sync_api = pytest.importorskip("playwright.sync_api")

from tests.browser.test_browser import CHROMIUM, MS, open_page, wait_for_pill  # noqa: E402

KEY = "web-app-key-0123456789abcdef"
REPLAY_CLIP = "en_ls_1272-128104-0000"  # 5.9 s


class TokenBackend:
    """What an application embedding Parley runs: it holds the API key and mints a
    meeting token for its page on request (CORS for the page's origin)."""

    def __init__(self, parley: ServerProcess) -> None:
        self.requests: list[dict[str, Any]] = []
        backend = self

        class Handler(BaseHTTPRequestHandler):
            def _cors(self) -> None:
                self.send_header("Access-Control-Allow-Origin", parley.http_url)
                self.send_header("Access-Control-Allow-Credentials", "true")
                self.send_header("Access-Control-Allow-Headers", "content-type")
                self.send_header("Access-Control-Allow-Methods", "POST")

            def do_OPTIONS(self) -> None:
                self.send_response(204)
                self._cors()
                self.end_headers()

            def do_POST(self) -> None:
                asked = json.loads(self.rfile.read(int(self.headers["content-length"])))
                backend.requests.append(asked)
                mint = urllib.request.Request(
                    f"{parley.http_url}/v1/meetings/{asked['meeting_id']}/tokens",
                    data=json.dumps({"scope": asked["scope"]}).encode(),
                    headers={"Authorization": f"Bearer {KEY}"},
                    method="POST",
                )
                with urllib.request.urlopen(mint, timeout=10) as response:
                    body = response.read()
                self.send_response(200)
                self._cors()
                self.send_header("content-type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/token"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def authed_server() -> Iterator[ServerProcess]:
    server = start_server({"PARLEY_API_KEYS": f"web:{KEY}"})
    yield server
    server.stop()


def test_page_streams_and_listens_with_meeting_tokens(authed_server: ServerProcess) -> None:
    """A replayed file is transcribed through an authenticated server: the page fetched a
    token for its listener and one for its stream, and never put one in a URL."""
    backend = TokenBackend(authed_server)
    the_clip = clip(REPLAY_CLIP)
    meeting = f"browser-auth-{int(time.time())}"
    try:
        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True)
            try:
                page = open_page(
                    browser, authed_server, f"?meeting={meeting}&token_url={backend.url}"
                )
                page.page.click("#join-watch")
                wait_for_pill(page, "feed-status", "live|waiting", 15)
                page.page.fill("#speaker-name", "Token Bot")
                page.page.set_input_files("#replay-file", str(the_clip.path))
                page.page.click("#replay-start")
                page.page.wait_for_function(
                    "() => document.getElementById('replay-status').textContent"
                    " === 'Replay finished.'",
                    timeout=(the_clip.duration + 60) * MS,
                )
                hypothesis = page.text()
                assert "token_url=" in page.page.url  # kept when the page rewrites its URL
            finally:
                browser.close()
    finally:
        backend.close()
    assert error_rate(the_clip.reference, hypothesis) <= 0.2, hypothesis
    scopes = [r["scope"] for r in backend.requests]
    assert "events" in scopes and "stream" in scopes, scopes
    assert all(r["meeting_id"] == meeting for r in backend.requests)
    assert "access_token=" not in authed_server.log()
    assert page.errors == [], page.errors
