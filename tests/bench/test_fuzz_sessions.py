"""bench/fuzz_sessions.py keeps working: one input of each scenario against
bench.fake_server, every check passing (the 100,000-input run is a bench, not CI)."""

from __future__ import annotations

import json
import random
from pathlib import Path

from bench import fuzz_sessions


def test_one_input_of_each_scenario_passes_every_check(tmp_path: Path) -> None:
    seeds: dict[str, int] = {}
    for seed in range(1, 1000):
        seeds.setdefault(fuzz_sessions.draw_scenario(random.Random(seed)), seed)
    assert set(seeds) == set(fuzz_sessions.SCENARIOS)
    argv = ["--report-dir", str(tmp_path), "--concurrency", "3", "--ttl-s", "2"]
    for seed in seeds.values():
        argv += ["--only", str(seed)]
    status = fuzz_sessions.main(argv)
    report = json.loads((tmp_path / "fuzz_sessions.json").read_text())
    assert report["failures"] == [] and report["resource_failures"] == [], report
    assert status == 0
    assert report["inputs"] == len(seeds)
    assert report["by_scenario"] == dict.fromkeys(fuzz_sessions.SCENARIOS, 1)
    assert sum(report["by_close"].values()) >= len(seeds)  # every socket's end was counted
    assert report["idle_end"]["sessions"] == 0 and report["idle_end"]["listeners"] == 0
