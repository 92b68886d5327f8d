"""`python -m deploy.local --nodes 3`: a whole Parley service on loopback, as it runs in
production (docs/operations.md#several-nodes-behind-a-balancer): Redis with Sentinel (a
primary, a replica, three sentinels), N nodes on it, and HAProxy in front of them.

    python -m deploy.local --nodes 3 --port 8080 [--keys FILE] [--workdir DIR]

Clients connect to `ws://127.0.0.1:8080/v1/meetings/<id>/stream` with an API key
(`Authorization: Bearer <key>`; without `--keys` one is made and printed). Ctrl-C stops
everything. Logs are under the work folder. tests/e2e/test_deploy.py and bench/nodes.py
start the same `Deployment`.
"""

from __future__ import annotations

import argparse
import contextlib
import secrets
import signal
import sys
import tempfile
import time
from pathlib import Path

from deploy.haproxy import HAProxy, config
from deploy.processes import START_TIMEOUT_S, ServerProcess, free_port, http_get
from deploy.sentinel import Sentineled

DRAIN_GRACE_S = 20.0  # PARLEY_DRAIN_GRACE_S of each node (the k8s preStop waits as long)
Node = ServerProcess  # one node: `python -m server` (or `bench.fake_server`) on its port


class Deployment:
    """Redis with Sentinel, `nodes` Parley nodes and HAProxy on `port`, all on loopback."""

    def __init__(
        self,
        workdir: Path,
        *,
        nodes: int = 3,
        port: int | None = None,
        keys_file: Path | None = None,
        module: str = "server",
        env: dict[str, str] | None = None,
        drain_grace_s: float = DRAIN_GRACE_S,
    ) -> None:
        """`drain_grace_s`: each node's PARLEY_DRAIN_GRACE_S, what `stop` waits out (the
        tests, whose teardown no balancer watches, set it short)."""
        self.workdir = workdir
        self.drain_grace_s = drain_grace_s
        self.port = port or free_port()
        self.redis = Sentineled(workdir)
        self.key = ""
        if keys_file is None:
            self.key = "parley-local-" + secrets.token_hex(16)
            keys_file = workdir / "api-keys"
            keys_file.write_text(f"local:{self.key}\n")
        node_env = {
            "PARLEY_REDIS_URL": self.redis.url,
            "PARLEY_API_KEYS_FILE": str(keys_file),
            "PARLEY_TRUSTED_PROXIES": "127.0.0.1",  # HAProxy's X-Forwarded-For
            "PARLEY_DRAIN_GRACE_S": str(drain_grace_s),
            "PARLEY_LOG_FORMAT": "text",
            **(env or {}),
        }
        self.nodes = [Node(module, node_env, workdir / f"node{i}.log") for i in range(nodes)]
        text = config("127.0.0.1", self.port, [("127.0.0.1", n.port) for n in self.nodes])
        self.haproxy = HAProxy(workdir, text, self.port)

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def start(self, ready_timeout: float = START_TIMEOUT_S) -> None:
        """Start everything; return once each node is ready (within `ready_timeout` s) and
        HAProxy sees them up."""
        try:
            self.redis.start()
            for node in self.nodes:  # models load side by side
                node.spawn()
            for node in self.nodes:
                node.wait_ready(ready_timeout)
            self.haproxy.start()
            self.wait_balanced()
        except BaseException:
            self.stop()
            raise

    def wait_balanced(self, timeout: float = 30.0) -> None:
        """Until a request through HAProxy is answered by a node (its checks passed)."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError):
                if http_get(self.http_url + "/readyz", 2.0)[0] == 200:
                    return
            if time.monotonic() > deadline:
                raise TimeoutError("HAProxy sends no request to a ready node")
            time.sleep(0.1)

    def stop(self) -> None:
        """Stop HAProxy, drain every node at once (each ends its streams within its
        grace), then stop Redis."""
        self.haproxy.stop()
        for node in self.nodes:
            if node.alive:
                node.process.send_signal(signal.SIGTERM)
        for node in self.nodes:
            node.end(timeout=self.drain_grace_s + 30)
        self.redis.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.local", description=__doc__)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--port", type=int, default=8080, help="HAProxy's port")
    parser.add_argument("--keys", type=Path, help="PARLEY_API_KEYS_FILE (default: one made)")
    parser.add_argument("--workdir", type=Path, help="logs and configs (default: a temp dir)")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="parley-local-"))
    workdir.mkdir(parents=True, exist_ok=True)
    deployment = Deployment(workdir, nodes=args.nodes, port=args.port, keys_file=args.keys)
    print(f"starting Redis+Sentinel, {args.nodes} nodes and HAProxy; logs in {workdir}")
    deployment.start()
    print(f"ready: {deployment.ws_url}/v1/meetings/<id>/stream  (Sentinel: {deployment.redis.url})")
    if deployment.key:
        print(f"API key: {deployment.key}")
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop as Ctrl-C does
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        print("stopping")
        deployment.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
