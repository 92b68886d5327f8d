"""How many CPUs this process may use: its affinity, capped by its cgroup's CPU quota.

`os.cpu_count()` counts the host's CPUs: a container limited to 2 CPUs on a 64-core host
would start 64 model workers of ~0.7 GB each, which the quota then throttles to 2 CPUs'
worth of time. The scheduler's affinity mask (`os.sched_getaffinity`, set by `taskset`
or a cpuset) and the CFS quota (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us` over
`cpu.cfs_period_us`) both bound what the process gets; the smaller one counts. A quota
of 2.5 CPUs counts as 2 (whole CPUs: a worker is one busy thread), at least 1.

The quota is read along the process's cgroup path (`/proc/self/cgroup`) under the
cgroup mount, every ancestor included (a parent's quota holds for its children too);
inside a container with its own cgroup namespace that path is `/`, the mount's root.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

PROC_CGROUP = Path("/proc/self/cgroup")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def available_cpus(
    proc_cgroup: Path = PROC_CGROUP, cgroup_root: Path = CGROUP_ROOT, affinity: int | None = None
) -> int:
    """The CPUs this process may use (see the module doc); `affinity`: the affinity mask's
    size (None: this process's)."""
    if affinity is None:
        affinity = _affinity()
    quota = cgroup_quota(proc_cgroup, cgroup_root)
    cpus = affinity if quota is None else min(affinity, int(quota))
    return max(1, cpus)


def _affinity() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1  # no affinity on this platform (macOS)


def cgroup_quota(proc_cgroup: Path = PROC_CGROUP, cgroup_root: Path = CGROUP_ROOT) -> float | None:
    """The smallest CPU quota (in CPUs) along this process's cgroup path, v2 or v1; None
    when there is none (or no cgroup to read)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    quotas: list[float] = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # v2: "0::/path"
            quotas += _along(cgroup_root, path, _v2_quota)
        elif "cpu" in controllers.split(","):  # v1: "4:cpu,cpuacct:/path"
            for mount in (cgroup_root / controllers, cgroup_root / "cpu"):
                if mount.is_dir():
                    quotas += _along(mount, path, _v1_quota)
                    break
    return min(quotas) if quotas else None


def _along(mount: Path, path: str, read: Callable[[Path], float | None]) -> list[float]:
    """The quotas `read` finds in the cgroup at `path` under `mount` and its ancestors
    (the mount's root included: a namespaced container sees its own cgroup there)."""
    quotas: list[float] = []
    parts = [p for p in path.split("/") if p]
    seen: set[Path] = set()
    for depth in range(len(parts), -1, -1):
        folder = mount.joinpath(*parts[:depth])
        if folder in seen:
            continue
        seen.add(folder)
        quota = read(folder)
        if quota is not None:
            quotas.append(quota)
    return quotas


def _v2_quota(folder: Path) -> float | None:
    """cgroup v2 `cpu.max`: "<quota> <period>" in µs, or "max <period>" (no quota)."""
    try:
        quota, _, period = (folder / "cpu.max").read_text().strip().partition(" ")
    except OSError:
        return None
    return _ratio(quota, period or "100000")


def _v1_quota(folder: Path) -> float | None:
    """cgroup v1 `cpu.cfs_quota_us` (-1: no quota) over `cpu.cfs_period_us`."""
    try:
        quota = (folder / "cpu.cfs_quota_us").read_text().strip()
        period = (folder / "cpu.cfs_period_us").read_text().strip()
    except OSError:
        return None
    return _ratio(quota, period)


def _ratio(quota: str, period: str) -> float | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:  # "max"
        return None
    return q / p if q > 0 and p > 0 else None
