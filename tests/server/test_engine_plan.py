"""One source of truth per setting: the engine a bench or a test builds from the settings
is the one the server builds and logs."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time

from deploy.processes import end_process, free_port
from engine.scheduling.config import SchedulerConfig
from server.engine_plan import describe_plan, plan_engine, scheduler_config_with
from server.settings import SchedulerSettings, Settings
from tests.support.appserver import serve_app
from tests.support.corpus import REPO

START_TIMEOUT = 120.0


def test_the_scheduler_defaults_are_the_settings() -> None:
    """max_batch_size and partial_share (and every other scheduler field) come from the
    settings groups: the engine's config type has no defaults of its own."""
    plan = plan_engine(Settings.from_env({}))
    group = SchedulerSettings()
    assert plan.scheduler.max_batch_size == group.max_batch_size
    assert plan.scheduler.partial_share == group.partial_share
    assert plan.scheduler.max_wait == group.batch_wait_ms / 1000
    required = [f.name for f in dataclasses.fields(SchedulerConfig)]
    assert all(
        f.default is dataclasses.MISSING
        for f in dataclasses.fields(SchedulerConfig)
        if f.name != "partial_burst"
    ), required
    bench = scheduler_config_with(workers=plan.workers, flat_batches=plan.scheduler.flat_batches)
    assert bench == plan.scheduler


async def test_the_server_runs_the_plan_of_its_settings() -> None:
    """An app built from settings runs the scheduler `plan_engine` gives for them."""
    async with serve_app(max_batch_size=8, partial_share=0.5, model_workers=2) as server:
        assert server.state.scheduler is not None
        running = server.state.scheduler.config
        assert running == plan_engine(server.state.settings).scheduler
        assert (running.max_batch_size, running.partial_share, running.workers) == (8, 0.5, 2)


def test_the_server_logs_the_plan_a_bench_computes() -> None:
    """`python -m bench.fake_server` (the server with a stand-in model) logs at start the
    very line bench.capacity prints from the same environment."""
    port = free_port()
    env = {
        **os.environ,
        "PARLEY_MAX_BATCH_SIZE": "8",
        "PARLEY_PARTIAL_SHARE": "0.5",
        "PARLEY_LOG_FORMAT": "text",
        "PARLEY_LOG_LEVEL": "info",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.fake_server", "--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    expected = describe_plan(plan_engine(Settings.from_env(env)))
    seen: list[str] = []
    try:
        assert process.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            line = process.stdout.readline()
            if not line:
                break
            seen.append(line)
            if "engine:" in line:
                break
        logged = next((line for line in seen if "engine:" in line), "")
        assert expected in logged, "".join(seen)
        assert "startup objects frozen" in logged  # engine.memory.freeze_startup_objects
        assert "max_batch_size=8" in expected and "partial_share=0.5" in expected
    finally:
        end_process(process)
        if process.stdout is not None:
            process.stdout.close()
