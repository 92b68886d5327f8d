"""Two network namespaces joined by a veth pair: a server's host and a client's, as far
as the server can tell two machines on one network. Made by the test itself (root, `ip`),
torn down after it; nothing of the host's own network is touched (the veth's ends and
their addresses exist only inside the two namespaces)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

SUBNET_BITS = 30  # a /30: the two ends and nothing else


@dataclass(frozen=True)
class Hosts:
    server_ns: str
    client_ns: str
    server_ip: str = "10.213.0.1"
    client_ip: str = "10.213.0.2"

    def inside(self, namespace: str) -> list[str]:
        """The command prefix that runs a program inside `namespace`."""
        return [_ip_binary(), "netns", "exec", namespace]


def _ip_binary() -> str:
    found = shutil.which("ip")
    if found is None:
        raise FileNotFoundError("ip (iproute2)")
    return found


def _ip(*args: str) -> None:
    subprocess.run([_ip_binary(), *args], check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def two_hosts(tag: str) -> Iterator[Hosts]:
    """Namespaces `<tag><pid>s` (server) and `<tag><pid>c` (client), lo up in each, joined
    by a veth pair on a private /30. Skips the test, saying why, where namespaces cannot
    be made (not root, no `ip`, no permission in a container)."""
    hosts = Hosts(f"{tag}{os.getpid()}s", f"{tag}{os.getpid()}c")
    made: list[str] = []
    try:
        for namespace in (hosts.server_ns, hosts.client_ns):
            try:
                _ip("netns", "add", namespace)
            except (OSError, subprocess.CalledProcessError) as exc:
                said = getattr(exc, "stderr", b"") or b""
                pytest.skip(f"cannot make a network namespace here: {exc} {said.decode()!r}")
            made.append(namespace)
        _ip("-n", hosts.server_ns, "link", "add", "veth0", "type", "veth",
            "peer", "name", "veth0", "netns", hosts.client_ns)  # fmt: skip
        for namespace, address in (
            (hosts.server_ns, hosts.server_ip),
            (hosts.client_ns, hosts.client_ip),
        ):
            _ip("-n", namespace, "addr", "add", f"{address}/{SUBNET_BITS}", "dev", "veth0")
            _ip("-n", namespace, "link", "set", "veth0", "up")
            _ip("-n", namespace, "link", "set", "lo", "up")
        yield hosts
    finally:
        for namespace in made:  # deleting a namespace deletes its end of the veth pair
            subprocess.run([_ip_binary(), "netns", "del", namespace], check=False, timeout=30)
