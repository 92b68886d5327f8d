"""Settings: typed parsing from the environment, validation, and the generated docs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from server.settings import Settings, markdown_table
from tests.corpus import REPO


def test_from_env_parses_types_and_overrides() -> None:
    """PARLEY_* variables are parsed to the field types; keyword overrides win."""
    settings = Settings.from_env(
        {"PARLEY_PORT": "9001", "PARLEY_BATCH_WAIT_MS": "12.5", "PARLEY_REDIS_URL": "redis://x"},
        host="0.0.0.0",
    )
    assert settings.port == 9001 and settings.batch_wait_ms == 12.5
    assert settings.redis_url == "redis://x" and settings.host == "0.0.0.0"
    assert Settings.from_env({}).redis_url is None


def test_bad_values_are_refused_with_the_variable_name() -> None:
    """A malformed or out-of-range value names the variable."""
    with pytest.raises(ValueError, match="PARLEY_PORT"):
        Settings.from_env({"PARLEY_PORT": "eighty"})
    with pytest.raises(ValueError, match="PARLEY_DEVICE"):
        Settings.from_env({"PARLEY_DEVICE": "tpu"})
    with pytest.raises(ValueError, match="PARLEY_CONTEXT_WINDOW_S"):
        Settings.from_env({"PARLEY_CONTEXT_WINDOW_S": "5"})
    for wait in ("-1", "250"):
        with pytest.raises(ValueError, match="PARLEY_VAD_BATCH_MS"):
            Settings.from_env({"PARLEY_VAD_BATCH_MS": wait})
    with pytest.raises(ValueError, match="PARLEY_MODEL_PROCESSES"):
        Settings.from_env({"PARLEY_MODEL_PROCESSES": "true"})


def test_model_workers_run_as_processes_on_the_cpu_unless_told_otherwise() -> None:
    """PARLEY_MODEL_PROCESSES: `auto` means processes on the CPU and threads on CUDA;
    `on` and `off` say so everywhere."""
    from engine.worker_processes import in_processes
    from server.app import model_config

    def decide(mode: str, device: str) -> bool:
        settings = Settings.from_env({"PARLEY_MODEL_PROCESSES": mode, "PARLEY_DEVICE": device})
        return in_processes(settings.model_processes, model_config(settings))  # type: ignore[arg-type]

    assert Settings.from_env({}).model_processes == "auto"
    assert decide("auto", "cpu") and not decide("auto", "cuda")
    assert decide("on", "cuda") and not decide("off", "cpu")


def test_batches_are_flat_on_cuda_and_per_row_on_the_cpu_unless_told_otherwise() -> None:
    """PARLEY_BATCH_COST: `auto` means flat batches (engine/policy.py rule 5) on CUDA and
    per-row on the CPU; `flat` and `per-row` say so everywhere; anything else is refused."""
    from server.app import flat_batches

    def decide(cost: str, device: str) -> bool:
        return flat_batches(Settings.from_env({"PARLEY_BATCH_COST": cost, "PARLEY_DEVICE": device}))

    assert Settings.from_env({}).batch_cost == "auto"
    assert decide("auto", "cuda") and not decide("auto", "cpu")
    assert decide("flat", "cpu") and not decide("per-row", "cuda")
    with pytest.raises(ValueError, match="PARLEY_BATCH_COST"):
        Settings.from_env({"PARLEY_BATCH_COST": "gpu"})


def test_the_context_window_reaches_the_recognizer_config() -> None:
    """PARLEY_CONTEXT_WINDOW_S caps the window a left context may fill (`context_window`)."""
    from server.app import model_config

    settings = Settings.from_env({"PARLEY_CONTEXT_WINDOW_S": "15"})
    assert model_config(settings).context_window == 15.0
    assert model_config(Settings.from_env({})).context_window == 20.0


def test_a_context_in_its_own_window_reaches_the_recognizer_and_drops_the_gate() -> None:
    """PARLEY_CONTEXT_OWN_WINDOW reaches the recognizer config; such a context never
    widens a window, so the scheduler gets no load gate for it."""
    from server.app import model_config

    own = Settings.from_env({"PARLEY_CONTEXT_OWN_WINDOW": "true"})
    assert model_config(own).context_own_window is True
    assert own.context_gate is None and own.context_budget is None
    grows = Settings.from_env({"PARLEY_CONTEXT_OWN_WINDOW": "false"})
    assert model_config(grows).context_own_window is False
    assert grows.context_gate == grows.context_below_utilization == 0.3
    assert grows.context_budget == grows.context_budget_ms / 1000 == 0.7
    assert Settings.from_env({"PARLEY_CONTEXT_BUDGET_MS": "0"}).context_budget is None
    with pytest.raises(ValueError, match="CONTEXT_BUDGET_MS"):
        Settings.from_env({"PARLEY_CONTEXT_BUDGET_MS": "-1"})


def test_configuration_doc_matches_settings() -> None:
    """docs/configuration.md lists exactly the settings the code reads."""
    doc = (REPO / "docs" / "configuration.md").read_text()
    assert markdown_table() in doc


def test_cli_help_lists_every_setting() -> None:
    """`python -m server --help` documents every PARLEY_* variable."""
    out = subprocess.run(
        [sys.executable, "-m", "server", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for name, _, _ in Settings.describe():
        assert name in out


def test_partials_decode_in_int8_where_finals_use_the_shortlist() -> None:
    """PARLEY_PARTIAL_QUANTIZE: `auto` is `int8-decoder` where QUANTIZE resolves to
    `int8-shortlist` (the CPU in float32), the finals' weights elsewhere."""
    from engine.loading import resolve_partial_quantize
    from server.app import model_config

    def resolved(env: dict[str, str], device: str = "cpu") -> str | None:
        return resolve_partial_quantize(model_config(Settings.from_env(env)), device)

    assert Settings.from_env({}).partial_quantize == "auto"
    assert resolved({}) == "int8-decoder"
    assert resolved({}, "cuda") is None
    assert resolved({"PARLEY_QUANTIZE": "none"}) is None
    assert resolved({"PARLEY_PARTIAL_QUANTIZE": "same"}) is None
    assert resolved({"PARLEY_QUANTIZE": "none", "PARLEY_PARTIAL_QUANTIZE": "int8-decoder"}) == (
        "int8-decoder"
    )
    with pytest.raises(ValueError, match="PARLEY_PARTIAL_QUANTIZE"):
        Settings.from_env({"PARLEY_PARTIAL_QUANTIZE": "int4"})
