"""The README stands alone: it names nothing outside the repository, and its example
streams the sample clip the repository carries."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import wave

import pytest

from tests.support.servers import ServerProcess
from tests.test_docs_anchors import REPO, sources

OUTSIDE = re.compile(r"\.\./shared|/work/shared|DESIGN\.md|STYLE\.md")
SAMPLE = REPO / "samples" / "jfk.wav"


def test_nothing_names_a_file_outside_the_repository() -> None:
    """No README, doc or module points at ../shared, DESIGN.md or STYLE.md (a clone has
    none of them)."""
    wrong = [
        f"{path.relative_to(REPO)}:{number}: {line.strip()}"
        for path in sources()
        if path != REPO / "tests" / "test_readme.py"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert not wrong, "paths outside the repository:\n" + "\n".join(wrong)


def test_the_sample_clip_is_what_the_examples_send() -> None:
    """samples/jfk.wav is 16 kHz mono 16-bit PCM, the format the README's example streams
    as it is, about 11 s long."""
    with wave.open(str(SAMPLE)) as clip:
        assert (clip.getframerate(), clip.getnchannels(), clip.getsampwidth()) == (16000, 1, 2)
        assert 10.5 < clip.getnframes() / clip.getframerate() < 11.5
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert readme.count("samples/jfk.wav") >= 2


@pytest.mark.slow
def test_the_readme_example_transcribes_the_sample(parley_server: ServerProcess) -> None:
    """The README's Python example, run as written from the repository root against a real
    server, gets the JFK sentence back as finals."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    example = next(
        block for block in re.findall(r"```python\n(.*?)```", readme, re.S) if "connect(" in block
    )
    assert "ws://127.0.0.1:8000" in example
    script = example.replace("ws://127.0.0.1:8000", parley_server.ws_url)
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    messages = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    said = " ".join(m["text"] for m in messages if m["type"] == "transcript.final")
    words = re.sub(r"[^a-z ]", "", said.lower())
    assert "ask not what your country can do for you" in words, said
    assert messages[-1]["type"] == "session.ended" and messages[-1]["finals_lost"] == 0
