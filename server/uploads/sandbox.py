"""The upload decoder's sandbox: bubblewrap namespaces plus a seccomp filter.

An uploaded file is parsed by FFmpeg, a large C code base; a file that exploits it runs
code as the decoder. `Sandbox.command()` wraps the decoder's command line in bubblewrap
(Debian `bubblewrap`, `bwrap`) so that such code finds:

- **no network**: a network namespace of its own (only a loopback with nothing on it),
  and a seccomp filter that fails `socket()`, `socketpair()` and `io_uring_setup()`
  with EACCES: no TCP, no UNIX socket (Redis, Docker), no netlink;
- **no secrets**: a mount namespace built from an allowlist: `/usr` (and its `/lib`,
  `/bin` links), `/etc/ld.so.cache`, the Python installation and virtualenv the server
  runs from, the worker script, the upload (read-only) and its output file. Nothing else
  of the host exists: not the API-keys file, not `/etc`, not other uploads, not the
  server's `/proc` (a fresh one shows only the sandbox), an empty `/tmp`. Files named in
  `hidden` (the keys file) are covered with an empty file even when they lie in an
  allowed folder;
- **no privileges**: its own user namespace as `nobody` (uid 65534), every capability
  dropped, no new privileges, its own PID, IPC and UTS namespaces and session, and it
  dies with the server.

`open_sandbox()` checks at start that bubblewrap works here. `auto` (the default) uses it
when it does; otherwise the decoder runs unconfined (rlimits, nice, a clean environment
only) for loopback clients, and uploads from anyone else are refused with 503
`sandbox_unavailable` (server/uploads/routes.py), with a warning at start. `bwrap` refuses to
start without it; `off` (or `none`, its older name) turns it off for every client, on
purpose.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import importlib.util
import logging
import os
import platform
import shutil
import struct
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

NOBODY = 65534
PROBE_TIMEOUT_S = 10.0
EXIT_SIGNAL_BASE = 128  # bwrap exits 128 + N when the sandboxed process died of signal N


class SandboxMode(enum.StrEnum):
    AUTO = "auto"  # bubblewrap when it works here, else unconfined with a warning
    BWRAP = "bwrap"  # bubblewrap or refuse to start
    OFF = "off"  # unconfined for every client, on purpose: rlimits, nice, a clean environment
    NONE = "none"  # the same as OFF (its first name)


class SandboxUnavailable(RuntimeError):
    """PARLEY_UPLOAD_SANDBOX=bwrap, and bubblewrap cannot run on this machine."""


# ---------------------------------------------------------------- seccomp

# Classic BPF over struct seccomp_data {int nr; u32 arch; ...}.
_LD_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_RET = 0x06  # BPF_RET | BPF_K
_ALLOW = 0x7FFF0000
_ERRNO = 0x00050000
_KILL_PROCESS = 0x80000000
_X32_BIT = 0x40000000  # x86-64's x32 ABI: refused wholesale
EACCES = 13

# machine → (AUDIT_ARCH_*, syscall numbers of socket, socketpair, io_uring_setup)
_DENIED: dict[str, tuple[int, tuple[int, ...]]] = {
    "x86_64": (0xC000003E, (41, 53, 425)),
    "aarch64": (0xC00000B7, (198, 199, 425)),
}


def seccomp_program(machine: str) -> bytes | None:
    """The filter (struct sock_filter[]) for `machine`, None where we have no table."""
    if machine not in _DENIED:
        return None
    arch, denied = _DENIED[machine]
    first_check = 4  # index of the first syscall comparison
    deny = first_check + len(denied) + 1  # index of the "deny" return
    kill = deny + 1
    program = [
        (_LD_ABS, 0, 0, 4),  # A = arch
        (_JEQ, 0, kill - 2, arch),  # another ABI: kill
        (_LD_ABS, 0, 0, 0),  # A = syscall number
        (_JGE, deny - 4, 0, _X32_BIT),
    ]
    for i, number in enumerate(denied):
        program.append((_JEQ, deny - (first_check + i) - 1, 0, number))
    program += [(_RET, 0, 0, _ALLOW), (_RET, 0, 0, _ERRNO | EACCES), (_RET, 0, 0, _KILL_PROCESS)]
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)


# ---------------------------------------------------------------- the sandbox


@dataclass(frozen=True, slots=True)
class Sandbox:
    """How decoder subprocesses are confined: `bwrap` is the bubblewrap binary, None to
    run them unconfined."""

    bwrap: str | None = None
    hidden: tuple[Path, ...] = ()  # files never visible inside, wherever they lie
    seccomp: bytes | None = None
    missing: str | None = None  # unconfined because `auto` found no working bubblewrap: why

    @property
    def confined(self) -> bool:
        return self.bwrap is not None

    def describe(self) -> str:
        if self.missing is not None:
            return "missing"
        if self.bwrap is None:
            return "off"
        return "bubblewrap" + ("+seccomp" if self.seccomp is not None else "")

    @contextlib.contextmanager
    def command(
        self, argv: Sequence[str], *, read: Sequence[Path] = (), write: Sequence[Path] = ()
    ) -> Iterator[tuple[list[str], tuple[int, ...]]]:
        """(command line, fds to pass) that run `argv` in the sandbox, seeing `read`
        read-only and `write` (existing files) writable. Unconfined: `argv` itself."""
        if self.bwrap is None:
            yield list(argv), ()
            return
        args = [self.bwrap, *_namespaces(), *_runtime_mounts()]
        for path in read:
            args += _bind("--ro-bind", Path(path))
        for path in write:
            args += _bind("--bind", Path(path))
        for path in self.hidden:
            if path.is_file():
                args += ["--ro-bind", "/dev/null", str(path)]
        with contextlib.ExitStack() as stack:
            fds: tuple[int, ...] = ()
            if self.seccomp is not None:
                fd = os.memfd_create("parley-seccomp", 0)
                stack.callback(os.close, fd)
                os.write(fd, self.seccomp)
                os.lseek(fd, 0, os.SEEK_SET)
                args += ["--seccomp", str(fd)]
                fds = (fd,)
            yield [*args, "--", *argv], fds


UNCONFINED = Sandbox()


def _namespaces() -> list[str]:
    return [
        "--unshare-all",  # user, network, PID, IPC, UTS, cgroup namespaces
        "--unshare-user",
        "--uid", str(NOBODY),
        "--gid", str(NOBODY),
        "--cap-drop", "ALL",
        "--die-with-parent",
        "--new-session",  # no TIOCSTI into the server's terminal
        "--clearenv",
        "--setenv", "PATH", "/usr/bin:/bin",
        "--setenv", "LANG", "C.UTF-8",
        "--setenv", "OMP_NUM_THREADS", "1",
        "--setenv", "OPENBLAS_NUM_THREADS", "1",
        "--proc", "/proc",
        "--dev", "/dev",
        "--tmpfs", "/tmp",
        "--chdir", "/",
    ]  # fmt: skip


def _bind(kind: str, path: Path) -> list[str]:
    """Bind `path` at its own name, and at its resolved name when a link leads there."""
    real = path.resolve()
    args = [kind, str(real), str(real)]
    if Path(os.path.abspath(path)) != real:
        args += [kind, str(real), os.path.abspath(path)]
    return args


def _runtime_mounts() -> list[str]:
    """The system libraries and the Python (with its packages) that run the worker."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in ("bin", "lib", "lib32", "lib64", "sbin"):
        top = Path("/") / name
        if top.is_symlink():
            args += ["--symlink", os.readlink(top), str(top)]
        elif top.is_dir():
            args += ["--ro-bind", str(top), str(top)]
    if Path("/etc/ld.so.cache").is_file():
        args += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    for root in _python_roots():
        args += _bind("--ro-bind", root)
    return args


def _python_roots() -> list[Path]:
    roots = {Path(p) for p in (sys.base_prefix, sys.prefix, sys.base_exec_prefix, sys.exec_prefix)}
    roots.add(Path(sys.executable).parent)
    spec = importlib.util.find_spec("av")  # PyAV, wherever it is installed
    if spec is not None and spec.origin is not None:
        roots.add(Path(spec.origin).parent.parent)
    usr = Path("/usr")
    kept: list[Path] = []
    for root in sorted(roots, key=lambda p: len(p.parts)):
        if root.resolve().is_relative_to(usr) or any(root.is_relative_to(k) for k in kept):
            continue
        kept.append(root)
    return kept


def open_sandbox(mode: SandboxMode, *, hidden: Sequence[Path] = ()) -> Sandbox:
    """The sandbox `mode` asks for, checked to work here. Raises SandboxUnavailable when
    `mode` is `bwrap` and bubblewrap cannot run; under `auto` without it, an unconfined
    sandbox that says what is `missing`."""
    if mode in (SandboxMode.OFF, SandboxMode.NONE):
        return UNCONFINED
    sandbox = Sandbox(
        bwrap=shutil.which("bwrap"),
        hidden=tuple(Path(p).resolve() for p in hidden),
        seccomp=seccomp_program(platform.machine()),
    )
    problem = "bubblewrap is not installed (Debian: apt-get install bubblewrap)"
    if sandbox.bwrap is not None:
        problem = _probe(Sandbox(sandbox.bwrap, seccomp=sandbox.seccomp))
    if not problem:
        return sandbox
    if mode is SandboxMode.BWRAP:
        raise SandboxUnavailable(f"PARLEY_UPLOAD_SANDBOX=bwrap, but {problem}")
    logger.warning(
        "upload decoder has no sandbox (%s): uploads from loopback clients are decoded "
        "unconfined, others refused with 503 sandbox_unavailable (install bubblewrap, or set "
        "PARLEY_UPLOAD_SANDBOX=off to decode them all unconfined)",
        problem,
    )
    return Sandbox(missing=problem)


def unsandboxed(missing: str) -> str:
    """Why a remote client's upload is refused where the sandbox is missing."""
    return (
        f"this server decodes uploads without a sandbox ({missing}), so only from loopback "
        "clients. Install bubblewrap, or set PARLEY_UPLOAD_SANDBOX=off to decode every "
        "client's uploads unconfined"
    )


@functools.cache  # the answer holds for the process's life
def _probe(sandbox: Sandbox) -> str:
    """Run the interpreter in the sandbox once: '' if it works, else what went wrong."""
    script = "import socket\ntry:\n socket.socket()\nexcept OSError:\n pass\nelse:\n exit(9)"
    if sandbox.seccomp is None:
        script = "pass"
    with sandbox.command([sys.executable, "-I", "-c", script]) as (argv, fds):
        try:
            done = subprocess.run(
                argv,
                pass_fds=fds,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=PROBE_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"bubblewrap could not run: {exc}"
    if done.returncode == 9:
        return "the seccomp filter did not take effect"
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip().splitlines()
        return f"bubblewrap failed ({said[-1] if said else f'exit {done.returncode}'})"
    return ""
