"""The server process holds numpy's OpenBLAS to one thread and bounds oneDNN's kernel cache
(`server/__init__.py`)."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = """
import os, sys
if sys.argv[1] == "server":
    import server  # noqa: F401
import numpy as np
a = np.ones((256, 256))
a @ a
print(len(os.listdir("/proc/self/task")))
"""


def threads_after_a_product(first: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENBLAS", "OMP"))}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, first], env=env, capture_output=True, text=True, check=True
    )
    return int(out.stdout)


def test_importing_the_server_first_leaves_openblas_one_thread() -> None:
    assert threads_after_a_product("server") == 1
    if (os.cpu_count() or 1) > 1:  # without it, OpenBLAS starts a thread per core
        assert threads_after_a_product("numpy") > 1


def onednn_cache_after_import(operator: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    if operator is not None:
        env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = operator
    probe = "import os, server; print(os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'])"
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_importing_the_server_bounds_onednns_kernel_cache_unless_the_operator_did() -> None:
    """16 kernels, not oneDNN's 1,024 (what grew in the model workers: `bench.worker_memory`),
    set before oneDNN first runs so the workers spawned later inherit it; an operator's
    own value wins."""
    assert onednn_cache_after_import(None) == "16"
    assert onednn_cache_after_import("256") == "256"
