"""The browser client (server/static/) in real headless Chromium against a real server and model.

Chromium's fake capture device plays a corpus clip into getUserMedia, so the page's
own microphone path (AudioWorklet, resampler, stream socket) carries real speech.
Screenshots and exports land in artifacts/browser/ (printed at the start of the run).
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from loadgen.wer import error_rate
from tests.support.corpus import REPO, Clip, clip
from tests.support.servers import ServerProcess
from tests.support.timeouts import S

pytestmark = pytest.mark.slow

sync_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = REPO / "artifacts" / "browser"
MIC_CLIP = "en_jfk"  # 11 s, several utterances
REPLAY_CLIP = "en_ls_1272-128104-0000"  # 5.9 s
MAX_WER = 0.2
MS = 1000 * S  # playwright counts its timeouts in milliseconds

# Records when each transcript line first appears, before the page's own script runs.
LINE_LOG = """
window.__lines = [];
document.addEventListener('DOMContentLoaded', () => {
  const list = document.getElementById('transcript');
  new MutationObserver((records) => {
    for (const r of records) for (const n of r.addedNodes) {
      if (!n.classList || !n.classList.contains('utt')) continue;
      window.__lines.push({
        kind: n.classList.contains('partial') ? 'partial' : 'final',
        utterance: n.dataset.utterance, t: performance.now(),
      });
    }
  }).observe(list, { childList: true });
});
"""

FINALS_JS = """() => [...document.querySelectorAll('#transcript > li.final')].map((li) => ({
  who: li.querySelector('.who').textContent,
  text: li.querySelector('.text').textContent,
  seq: Number(li.dataset.seq),
  utterance: li.dataset.utterance,
  latency: li.querySelector('.lat')?.textContent ?? null,
}))"""


@pytest.fixture(scope="module")
def artifacts(request: pytest.FixtureRequest) -> Path:
    """A clean artifacts/browser/ folder, announced on the terminal."""
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if capture is not None and reporter is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"\nbrowser test artifacts (screenshots, exports): {ARTIFACTS}")
    return ARTIFACTS


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Debian Chromium whose microphone plays the mic clip once."""
    if not CHROMIUM.exists():
        pytest.fail("Chromium is missing: apt-get install -y chromium (see .ci/run)")
    wav = clip(MIC_CLIP).path
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM),
            headless=True,
            args=[
                "--use-fake-ui-for-media-stream",
                "--use-fake-device-for-media-stream",
                # %noloop: play the file once, then silence (the default loops it).
                f"--use-file-for-fake-audio-capture={wav}%noloop",
            ],
        )
        yield browser
        browser.close()


@dataclass
class Page:
    """A page plus everything it reported that a test may want to assert on."""

    page: Any
    errors: list[str] = field(default_factory=list)

    def finals(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.page.evaluate(FINALS_JS)
        return result

    def text(self) -> str:
        return " ".join(f["text"] for f in self.finals())

    def shot(self, folder: Path, name: str) -> None:
        self.page.screenshot(path=str(folder / name), full_page=True)


def open_page(browser: Any, server: ServerProcess, query: str, **viewport: int) -> Page:
    context = browser.new_context(
        viewport=viewport or {"width": 1280, "height": 800}, accept_downloads=True
    )
    context.add_init_script(LINE_LOG)
    page = context.new_page()
    page.set_default_timeout(30 * MS)
    wrapped = Page(page)
    page.on("pageerror", lambda exc: wrapped.errors.append(f"pageerror: {exc}"))
    page.on(
        "console",
        lambda msg: wrapped.errors.append(f"console: {msg.text}") if msg.type == "error" else None,
    )
    page.goto(f"{server.http_url}/{query}")
    return wrapped


def wait_for_pill(page: Page, pill: str, pattern: str, timeout_s: float) -> None:
    page.page.wait_for_function(
        "([id, re]) => new RegExp(re).test(document.querySelector(`#${id} .label`).textContent)",
        arg=[pill, pattern],
        timeout=timeout_s * MS,
    )


def wait_until_sent(page: Page, seconds: float, timeout_s: float) -> None:
    """Wait until the page's stream has sent `seconds` of audio (its timeline position).
    The fake microphone plays the clip from when the page opened it, which on a loaded
    machine can be seconds after the click: a wall-clock wait from the click cut the end."""
    page.page.wait_for_function(
        "s => (window.parley.state.source?.stream?.streamSeconds ?? 0) >= s",
        arg=seconds,
        timeout=timeout_s * MS,
    )


def parse_srt(text: str) -> list[tuple[int, float, float, str]]:
    """Strict SubRip parse: numbered blocks, HH:MM:SS,mmm --> HH:MM:SS,mmm, text lines."""
    stamp = r"(\d{2}):([0-5]\d):([0-5]\d),(\d{3})"
    timing = re.compile(rf"^{stamp} --> {stamp}$")
    cues = []
    for number, block in enumerate(text.strip("\n").split("\n\n"), start=1):
        lines = block.split("\n")
        assert len(lines) >= 3, f"cue {number} is not index, timing, text: {block!r}"
        assert lines[0] == str(number), f"cue {number} numbered {lines[0]!r}"
        m = timing.match(lines[1])
        assert m, f"cue {number} timing line {lines[1]!r}"
        g = [int(x) for x in m.groups()]
        start = g[0] * 3600 + g[1] * 60 + g[2] + g[3] / 1000
        end = g[4] * 3600 + g[5] * 60 + g[6] + g[7] / 1000
        assert end > start, f"cue {number} ends before it starts"
        assert all(line.strip() for line in lines[2:]), f"cue {number} has an empty text line"
        cues.append((number, start, end, "\n".join(lines[2:])))
    return cues


@dataclass
class MicRun:
    """What one microphone session (and a watcher of the same meeting) produced."""

    clip: Clip
    speaker: Page
    watcher: Page
    lines: list[dict[str, Any]]
    speaker_finals: list[dict[str, Any]]
    watcher_finals: list[dict[str, Any]]
    srt: str
    seconds: float


@pytest.fixture(scope="module")
def mic_run(browser: Any, parley_server: ServerProcess, artifacts: Path) -> MicRun:
    """A watcher opens the meeting, then a speaker joins with the (fake) microphone,
    speaks the clip, stops, and exports SRT. Screenshots during and after."""
    the_clip = clip(MIC_CLIP)
    meeting = f"browser-mic-{int(time.time())}"
    watcher = open_page(browser, parley_server, "", width=390, height=844)
    watcher.page.fill("#meeting-id", meeting)
    watcher.page.click("#join-watch")
    wait_for_pill(watcher, "feed-status", "live", 10 * S)

    speaker = open_page(browser, parley_server, f"?meeting={meeting}")
    assert speaker.page.input_value("#meeting-id") == meeting  # the shared link fills it in
    speaker.page.fill("#your-name", "Ada Lovelace")
    started = time.monotonic()
    speaker.page.click("#join-mic")
    wait_for_pill(speaker, "stream-status", "streaming", 30 * S)
    speaker.page.wait_for_selector("#transcript > li.partial", timeout=30 * MS)
    speaker.shot(artifacts, "01-speaker-first-partial.png")
    speaker.page.wait_for_selector("#transcript > li.final", timeout=30 * MS)
    speaker.shot(artifacts, "02-speaker-during.png")
    watcher.shot(artifacts, "03-watcher-during.png")

    # Let the whole clip play into the microphone, then stop: the page sends the rest
    # and `stop`, and the server answers with the last finals and `session.ended`.
    wait_until_sent(speaker, the_clip.duration + 1.5, the_clip.duration + 60)
    speaker.page.click("#mic-stop")
    wait_for_pill(speaker, "stream-status", "stopped", 60 * S)
    seconds = time.monotonic() - started
    speaker_finals = speaker.finals()
    watcher.page.wait_for_function(
        "n => document.querySelectorAll('#transcript > li.final').length >= n",
        arg=len(speaker_finals),
        timeout=10 * MS,
    )
    with speaker.page.expect_download() as download:
        speaker.page.click("[data-export=srt]")
    srt = Path(download.value.path()).read_text(encoding="utf-8")
    (artifacts / "speaker.srt").write_text(srt, encoding="utf-8")
    for fmt in ("vtt", "txt", "json"):
        with speaker.page.expect_download() as download:
            speaker.page.click(f"[data-export={fmt}]")
        download.value.save_as(str(artifacts / f"speaker.{fmt}"))
    speaker.shot(artifacts, "04-speaker-after.png")
    watcher.shot(artifacts, "05-watcher-after.png")
    return MicRun(
        clip=the_clip,
        speaker=speaker,
        watcher=watcher,
        lines=speaker.page.evaluate("() => window.__lines"),
        speaker_finals=speaker_finals,
        watcher_finals=watcher.finals(),
        srt=srt,
        seconds=seconds,
    )


def test_microphone_finals_match_the_clip(mic_run: MicRun) -> None:
    """The speaker's page shows finals whose words match the clip (WER <= 0.2)."""
    hypothesis = " ".join(f["text"] for f in mic_run.speaker_finals)
    wer = error_rate(mic_run.clip.reference, hypothesis)
    assert mic_run.speaker_finals, "no finals on the page"
    assert wer <= MAX_WER, f"WER {wer:.3f}: {hypothesis!r} vs {mic_run.clip.reference!r}"
    assert {f["who"] for f in mic_run.speaker_finals} == {"Ada Lovelace"}
    assert all(f["latency"] for f in mic_run.speaker_finals), "a final without its latency"
    assert mic_run.speaker.errors == []


def test_partials_appear_before_their_finals(mic_run: MicRun) -> None:
    """Partials are shown while speaking, and each is replaced by its final."""
    first: dict[tuple[str, str], float] = {}
    for line in mic_run.lines:
        first.setdefault((line["kind"], line["utterance"]), line["t"])
    partials = {u: t for (kind, u), t in first.items() if kind == "partial"}
    finals = {u: t for (kind, u), t in first.items() if kind == "final"}
    assert partials, "no partial was ever shown"
    assert min(partials.values()) < min(finals.values())
    led = [u for u in finals if u in partials and partials[u] < finals[u]]
    assert led, "no final was preceded by a partial of the same utterance"
    assert all(partials[u] < finals[u] for u in finals if u in partials)
    leftover = mic_run.speaker.page.evaluate(
        "() => document.querySelectorAll('#transcript > li.partial').length"
    )
    assert leftover == 0, "a partial stayed on screen after the stream ended"


def test_watch_only_page_shows_the_same_finals(mic_run: MicRun) -> None:
    """A second, watch-only page of the meeting shows the same finals in the same order."""

    def key(fs: list[dict[str, Any]]) -> list[tuple[str, str, int]]:
        return [(f["who"], f["text"], f["seq"]) for f in fs]

    assert key(mic_run.watcher_finals) == key(mic_run.speaker_finals)
    assert mic_run.watcher.page.is_hidden("#stream-status"), "the watcher streamed audio"
    assert mic_run.watcher.errors == []


def test_srt_export_is_valid(mic_run: MicRun) -> None:
    """The SRT download parses strictly and holds one cue per final, in order."""
    cues = parse_srt(mic_run.srt)
    assert [c[3] for c in cues] == [f"{f['who']}: {f['text']}" for f in mic_run.speaker_finals]
    starts = [c[1] for c in cues]
    assert starts == sorted(starts)
    assert cues[-1][2] <= mic_run.clip.duration + 3.0


def test_dropped_stream_reconnects_without_losing_words(
    browser: Any, parley_server: ServerProcess, artifacts: Path
) -> None:
    """The stream socket drops mid-sentence; the page says so, reconnects (resuming
    where the server can), re-sends its buffered audio, and no words go missing."""
    the_clip = clip(MIC_CLIP)
    meeting = f"browser-drop-{int(time.time())}"
    page = open_page(browser, parley_server, f"?meeting={meeting}")
    streams: list[tuple[Any, Any]] = []

    def through(route: Any) -> None:  # a transparent proxy we can cut
        streams.append((route, route.connect_to_server()))

    page.page.route_web_socket(re.compile(r"/v1/meetings/[^/]+/stream\?"), through)
    page.page.fill("#your-name", "Grace Hopper")
    page.page.click("#join-mic")
    wait_for_pill(page, "stream-status", "streaming", 30 * S)
    wait_until_sent(page, 5.0, 60)  # mid-sentence
    to_page, to_server = streams[-1]
    # Not a clean close on either side: the server treats it as a lost connection
    # (keeps the session resumable), the page as a drop to recover from.
    to_server.close(code=4000, reason="test: connection cut")
    to_page.close(code=4000, reason="test: connection cut")
    wait_for_pill(page, "stream-status", "reconnected", 30 * S)
    page.shot(artifacts, "08-reconnected.png")
    wait_until_sent(page, the_clip.duration + 1.5, the_clip.duration + 60)
    page.page.click("#mic-stop")
    wait_for_pill(page, "stream-status", "stopped", 60 * S)
    page.shot(artifacts, "09-reconnected-after.png")
    notices = page.page.eval_on_selector_all(
        "#transcript > li.notice", "els => els.map((e) => e.textContent)"
    )
    assert any("lost its connection" in n for n in notices), notices
    assert any("reconnected" in n for n in notices), notices
    assert len(streams) >= 2, "the page never opened a second stream socket"
    hypothesis = page.text()
    wer = error_rate(the_clip.reference, hypothesis)
    assert wer <= MAX_WER, f"WER {wer:.3f} after a drop: {hypothesis!r} (notices: {notices})"
    assert not [e for e in page.errors if e.startswith("pageerror")], page.errors


def test_replay_of_a_file_is_transcribed(
    browser: Any, parley_server: ServerProcess, artifacts: Path
) -> None:
    """A corpus file chosen in the page's file input streams at real time and is transcribed."""
    the_clip = clip(REPLAY_CLIP)
    meeting = f"browser-replay-{int(time.time())}"
    page = open_page(browser, parley_server, f"?meeting={meeting}")
    page.page.click("#join-watch")
    page.page.fill("#speaker-name", "Replay Bot")
    page.page.set_input_files("#replay-file", str(the_clip.path))
    started = time.monotonic()
    page.page.click("#replay-start")
    wait_for_pill(page, "stream-status", "streaming", 30 * S)
    page.page.wait_for_timeout(the_clip.duration * 600)
    page.shot(artifacts, "06-replay-during.png")
    page.page.wait_for_function(
        "() => document.getElementById('replay-status').textContent === 'Replay finished.'",
        timeout=(the_clip.duration + 60) * MS,
    )
    elapsed = time.monotonic() - started
    page.shot(artifacts, "07-replay-after.png")
    hypothesis = page.text()
    wer = error_rate(the_clip.reference, hypothesis)
    assert wer <= MAX_WER, f"WER {wer:.3f}: {hypothesis!r} vs {the_clip.reference!r}"
    assert {f["who"] for f in page.finals()} == {"Replay Bot"}
    # Real time: streaming the file takes about as long as the file plays.
    assert elapsed >= the_clip.duration * 0.95
    assert page.errors == []
