"""The upload decoder's sandbox: code running as the decoder reaches no network and no
secret. A probe stands in for an exploited decoder: it is run by `decode_file` exactly as
the real worker is, tries what an attacker would, and writes what it got as its output."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from server.uploads import decode
from server.uploads.decode import DecodeLimits, decode_file
from server.uploads.decode_worker import Refusal
from server.uploads.sandbox import NOBODY, UNCONFINED, Sandbox, SandboxMode, open_sandbox

LIMITS = DecodeLimits(max_seconds=60, cpu_seconds=30, memory_bytes=512 << 20, wall_seconds=30)

PROBE = """
import json, os, socket, sys
found = {}
def attempt(name, action):
    try:
        result = action()
        found[name] = result if isinstance(result, list) else "allowed"
    except OSError as exc:
        found[name] = exc.errno
def connect(port):
    with socket.create_connection(("127.0.0.1", port), timeout=2):
        pass
attempt("read_keys", lambda: open(%(keys)r).read())
attempt("list_uploads", lambda: os.listdir(%(uploads)r))
attempt("server_environ", lambda: open("/proc/%(server_pid)d/environ").read())
attempt("connect_loopback", lambda: connect(%(port)d))
attempt("connect_redis", lambda: connect(6379))
attempt("inet_socket", lambda: socket.socket(socket.AF_INET).close())
attempt("unix_socket", lambda: socket.socket(socket.AF_UNIX).close())
attempt("overwrite_worker", lambda: open(__file__, "a").write("x"))
attempt("plant", lambda: open(%(outside)r, "w").write("x"))
with open(sys.argv[-1], "w") as out:
    json.dump(found, out)
print(json.dumps({"ok": True, "samples": 0, "format": "probe", "codec": "probe",
                  "sample_rate": 16000, "channels": 1, "output_channels": 1}))
"""


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP port on the host's loopback that accepts connections."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        yield server.getsockname()[1]


async def probe(tmp_path: Path, port: int, sandbox: Sandbox, keys: Path) -> dict[str, object]:
    """Run the probe as the decoder of an upload in `tmp_path`/job; return what it got."""
    uploads = tmp_path / "uploads"
    job = uploads / "job"
    job.mkdir(parents=True)
    (uploads / "other-job").mkdir()
    script = tmp_path / "probe.py"
    script.write_text(
        PROBE
        % {
            "keys": str(keys),
            "uploads": str(uploads),
            "server_pid": os.getpid(),
            "port": port,
            "outside": str(uploads / "planted"),
        }
    )
    src = job / "upload"
    src.write_bytes(b"RIFF")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decode, "WORKER", script)
        audio = await decode_file(src, job / "audio.s16", LIMITS, sandbox)
    found: dict[str, object] = json.loads(audio.path.read_text())
    return found


async def test_decoder_reaches_no_network_and_no_secret(tmp_path: Path, listener: int) -> None:
    """In the sandbox the decoder cannot read the keys file, other uploads or the server's
    environment, connect to the host's loopback (Redis included) or create any socket;
    the same probe unconfined can (so the probe is not vacuous)."""
    keys = tmp_path / "keys.txt"
    keys.write_text("tenant:secret-key-0123456789abcdef\n")
    open_door = await probe(tmp_path / "unconfined", listener, UNCONFINED, keys)
    assert open_door["read_keys"] == "allowed", open_door
    assert open_door["connect_loopback"] == "allowed", open_door
    assert "other-job" in open_door["list_uploads"], open_door  # type: ignore[operator]

    found = await probe(tmp_path / "sandboxed", listener, open_sandbox(SandboxMode.BWRAP), keys)
    assert found["read_keys"] == errno.ENOENT, found
    assert found["list_uploads"] == ["job"], found  # only the path to its own upload
    assert found["server_environ"] == errno.ENOENT, found
    assert found["overwrite_worker"] in (errno.EROFS, errno.EACCES), found
    assert not (tmp_path / "sandboxed" / "uploads" / "planted").exists()  # a private /tmp
    for name in ("connect_loopback", "connect_redis", "inet_socket", "unix_socket"):
        assert found[name] != "allowed", (name, found)
    if platform.machine() in ("x86_64", "aarch64"):  # the seccomp filter: no socket at all
        assert found["inet_socket"] == found["unix_socket"] == errno.EACCES, found


def test_hidden_files_are_covered_inside_allowed_folders(tmp_path: Path) -> None:
    """A secret that lies in a folder the sandbox shows (as the keys file could lie in
    the virtualenv) cannot be read inside; its neighbours can."""
    secret = tmp_path / "keys.txt"
    secret.write_text("tenant:secret-key-0123456789abcdef")
    (tmp_path / "neighbour.txt").write_text("visible")
    sandbox = open_sandbox(SandboxMode.BWRAP, hidden=[secret])
    script = (
        "import sys\nfor name in sys.argv[1:]:\n try:\n  print(repr(open(name).read()))\n"
        " except OSError as exc:\n  print(exc.errno)"
    )
    argv = [sys.executable, "-I", "-c", script, str(secret), str(tmp_path / "neighbour.txt")]
    with sandbox.command(argv, read=[tmp_path]) as (command, fds):
        done = subprocess.run(command, pass_fds=fds, capture_output=True, text=True, check=True)
    secret_read, neighbour_read = done.stdout.split()
    assert "secret-key" not in secret_read, done.stdout
    assert neighbour_read == "'visible'", done.stdout


async def test_sandboxed_decoder_killed_by_its_cpu_limit_is_a_decode_limit(
    tmp_path: Path,
) -> None:
    """A decoder that spins until RLIMIT_CPU kills it inside the sandbox is refused as
    `decode_limit` (bwrap reports the signal as 128 + N)."""
    script = tmp_path / "spin.py"
    script.write_text(
        "import resource\nresource.setrlimit(resource.RLIMIT_CPU, (1, 1))\nwhile True:\n pass\n"
    )
    src = tmp_path / "upload"
    src.write_bytes(b"RIFF")
    sandbox = open_sandbox(SandboxMode.BWRAP)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(decode, "WORKER", script)
        with pytest.raises(Refusal) as caught:
            await asyncio.wait_for(decode_file(src, tmp_path / "out", LIMITS, sandbox), 20)
    assert (caught.value.status, caught.value.code) == (422, "decode_limit")
    assert "CPU-time" in caught.value.message


ATTACK = '''
def decode(src, dst, max_seconds, *options):
    """An exploited decoder: after the worker's own limits, it tries to fork and to start
    a thread, and writes what it got."""
    import json, os, threading
    found = {}
    try:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        found["fork"] = "allowed"
    except OSError as exc:
        found["fork"] = exc.errno
    try:
        threading.Thread(target=lambda: None).start()
        found["thread"] = "allowed"
    except RuntimeError as exc:
        found["thread"] = str(exc)
    with open(dst, "w") as out:
        json.dump(found, out)
    return {"ok": True, "samples": 0, "format": "attack", "codec": "attack",
            "sample_rate": 16000, "channels": 1, "output_channels": 1}


if __name__ == "__main__":'''


def test_an_exploited_decoder_can_start_no_process() -> None:
    """Code that runs as the decoder after the worker's own limits (the real worker, its
    `decode` replaced by the attack) can neither fork nor start a thread (RLIMIT_NPROC):
    no fork bomb of the server's user. Run as `nobody` when the tests run as root: the
    kernel exempts root's processes from the limit (docs/operations.md)."""
    folder = Path(tempfile.mkdtemp(prefix="parley-attack-"))
    try:
        folder.chmod(0o755)
        worker = folder / "decode_worker.py"
        worker.write_text(decode.WORKER.read_text().replace('\nif __name__ == "__main__":', ATTACK))
        src, dst = folder / "upload", folder / "out.json"
        src.write_bytes(b"RIFF")
        dst.touch()
        for path in (worker, src, dst):
            path.chmod(0o666)
        argv = [sys.executable, "-I", str(worker), "--max-seconds", "60", "--cpu-seconds",
                "30", "--memory-bytes", str(512 << 20), str(src), str(dst)]  # fmt: skip
        if os.getuid() == 0:  # util-linux's setpriv: as `nobody`, no groups
            drop = shutil.which("setpriv")
            if drop is None:
                pytest.skip("running as root, and no setpriv to run the decoder as nobody")
            argv = [drop, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]
        done = subprocess.run(argv, capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr[-2000:]
        found = json.loads(dst.read_text())
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert found["fork"] == errno.EAGAIN, found
    assert found["thread"] != "allowed", found
