"""engine.cpus: the CPUs a process may use, from its affinity and cgroup quota files
(written here to a temporary folder, laid out as /proc/self/cgroup and /sys/fs/cgroup)."""

from __future__ import annotations

import os
from pathlib import Path

from engine.cpus import available_cpus, cgroup_quota


def layout(tmp_path: Path, cgroup: str, files: dict[str, str]) -> tuple[Path, Path]:
    tmp_path.mkdir(exist_ok=True)
    proc = tmp_path / "cgroup"
    proc.write_text(cgroup)
    root = tmp_path / "sys"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    root.mkdir(exist_ok=True)
    return proc, root


def test_cgroup_v2_quota_caps_the_affinity(tmp_path: Path) -> None:
    """A container's own namespace (`0::/`): cpu.max at the mount's root; 2.5 CPUs count
    as 2, and the smaller of quota and affinity wins."""
    proc, root = layout(tmp_path, "0::/\n", {"cpu.max": "250000 100000\n"})
    assert cgroup_quota(proc, root) == 2.5
    assert available_cpus(proc, root, affinity=64) == 2
    assert available_cpus(proc, root, affinity=1) == 1


def test_cgroup_v2_no_quota_leaves_the_affinity(tmp_path: Path) -> None:
    proc, root = layout(tmp_path, "0::/\n", {"cpu.max": "max 100000\n"})
    assert cgroup_quota(proc, root) is None
    assert available_cpus(proc, root, affinity=6) == 6


def test_cgroup_v2_the_smallest_quota_on_the_path_counts(tmp_path: Path) -> None:
    """A nested cgroup: a parent's quota holds for its children; under one CPU: one."""
    proc, root = layout(
        tmp_path,
        "0::/kubepods/pod1/app\n",
        {
            "kubepods/cpu.max": "max 100000",
            "kubepods/pod1/cpu.max": "400000 100000",
            "kubepods/pod1/app/cpu.max": "max 100000",
        },
    )
    assert cgroup_quota(proc, root) == 4.0
    assert available_cpus(proc, root, affinity=64) == 4
    proc, root = layout(tmp_path / "small", "0::/\n", {"cpu.max": "50000 100000"})
    assert available_cpus(proc, root, affinity=8) == 1


def test_cgroup_v1_quota(tmp_path: Path) -> None:
    """v1: cpu.cfs_quota_us over cpu.cfs_period_us in the cpu controller's mount; -1 is
    no quota."""
    cgroup = "12:memory:/x\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/x\n"
    files = {
        "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "300000\n",
        "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
        "cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
        "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
    }
    proc, root = layout(tmp_path, cgroup, files)
    assert cgroup_quota(proc, root) == 3.0
    assert available_cpus(proc, root, affinity=16) == 3
    proc, root = layout(tmp_path / "none", cgroup, {"cpu/cpu.cfs_quota_us": "-1"})
    assert available_cpus(proc, root, affinity=16) == 16


def test_no_cgroup_files_means_the_affinity(tmp_path: Path) -> None:
    """No /proc/self/cgroup (not Linux) or nothing readable: the affinity mask alone; this
    process's own count is at least one and at most its affinity."""
    missing = tmp_path / "missing"
    assert cgroup_quota(missing, tmp_path) is None
    assert available_cpus(missing, tmp_path, affinity=3) == 3
    assert 1 <= available_cpus() <= len(os.sched_getaffinity(0))
