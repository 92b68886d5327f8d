"""Settings: typed parsing from the environment, validation, and the generated docs."""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys

import orjson
import pytest

from server.settings import SettingError, Settings, field_groups, markdown_table
from tests.support.corpus import REPO
from tests.support.timeouts import S


def test_from_env_parses_types_and_overrides() -> None:
    """PARLEY_* variables are parsed to the field types; keyword overrides win."""
    settings = Settings.from_env(
        {"PARLEY_PORT": "9001", "PARLEY_BATCH_WAIT_MS": "12.5", "PARLEY_REDIS_URL": "redis://x"},
        host="0.0.0.0",
    )
    assert settings.server.port == 9001 and settings.scheduler.batch_wait_ms == 12.5
    assert settings.store.redis_url == "redis://x" and settings.server.host == "0.0.0.0"
    assert Settings.from_env({}).store.redis_url is None


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
    from engine.workers.processes import in_processes
    from server.engine_plan import model_config

    def decide(mode: str, device: str) -> bool:
        settings = Settings.from_env({"PARLEY_MODEL_PROCESSES": mode, "PARLEY_DEVICE": device})
        return in_processes(settings.model.model_processes, model_config(settings))

    assert Settings.from_env({}).model.model_processes == "auto"
    assert decide("auto", "cpu") and not decide("auto", "cuda")
    assert decide("on", "cuda") and not decide("off", "cpu")


def test_batches_are_flat_on_cuda_and_per_row_on_the_cpu_unless_told_otherwise() -> None:
    """PARLEY_BATCH_COST: `auto` means flat batches (engine/scheduling/policy.py rule 5) on CUDA and
    per-row on the CPU; `flat` and `per-row` say so everywhere; anything else is refused."""
    from server.engine_plan import flat_batches, model_config

    def decide(cost: str, device: str) -> bool:
        settings = Settings.from_env({"PARLEY_BATCH_COST": cost, "PARLEY_DEVICE": device})
        return flat_batches(settings, model_config(settings))

    assert Settings.from_env({}).scheduler.batch_cost == "auto"
    assert decide("auto", "cuda") and not decide("auto", "cpu")
    assert decide("flat", "cpu") and not decide("per-row", "cuda")
    with pytest.raises(ValueError, match="PARLEY_BATCH_COST"):
        Settings.from_env({"PARLEY_BATCH_COST": "gpu"})


def test_the_context_window_reaches_the_recognizer_config() -> None:
    """PARLEY_CONTEXT_WINDOW_S caps the window a left context may fill (`context_window`)."""
    from server.engine_plan import model_config

    settings = Settings.from_env({"PARLEY_CONTEXT_WINDOW_S": "15"})
    assert model_config(settings).context_window == 15.0
    assert model_config(Settings.from_env({})).context_window == 20.0


def test_a_context_in_its_own_window_reaches_the_recognizer_and_drops_the_gate() -> None:
    """PARLEY_CONTEXT_OWN_WINDOW reaches the recognizer config; such a context never
    widens a window, so the scheduler gets no load gate for it."""
    from server.engine_plan import model_config

    own = Settings.from_env({"PARLEY_CONTEXT_OWN_WINDOW": "true"})
    assert model_config(own).context_own_window is True
    assert own.context.context_gate is None and own.context.context_budget is None
    grows = Settings.from_env({"PARLEY_CONTEXT_OWN_WINDOW": "false"})
    assert model_config(grows).context_own_window is False
    assert grows.context.context_gate == grows.context.context_below_utilization == 0.3
    assert grows.context.context_budget == grows.context.context_budget_ms / 1000 == 0.7
    assert Settings.from_env({"PARLEY_CONTEXT_BUDGET_MS": "0"}).context.context_budget is None
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
    from server.engine_plan import model_config

    def resolved(env: dict[str, str], device: str = "cpu") -> str | None:
        return resolve_partial_quantize(model_config(Settings.from_env(env)), device)

    assert Settings.from_env({}).model.partial_quantize == "auto"
    assert resolved({}) == "int8-decoder"
    assert resolved({}, "cuda") is None
    assert resolved({"PARLEY_QUANTIZE": "none"}) is None
    assert resolved({"PARLEY_PARTIAL_QUANTIZE": "same"}) is None
    assert resolved({"PARLEY_QUANTIZE": "none", "PARLEY_PARTIAL_QUANTIZE": "int8-decoder"}) == (
        "int8-decoder"
    )
    with pytest.raises(ValueError, match="PARLEY_PARTIAL_QUANTIZE"):
        Settings.from_env({"PARLEY_PARTIAL_QUANTIZE": "int4"})


# One bad value of each group, and bad combinations within and across groups: the
# variable the refusal must name, and the environment that sets it.
REFUSED: list[tuple[str, dict[str, str]]] = [
    ("PARLEY_PORT", {"PARLEY_PORT": "eighty"}),  # not even a number
    ("PARLEY_LOG_LEVEL", {"PARLEY_LOG_LEVEL": "loud"}),  # server
    ("PARLEY_DEVICE", {"PARLEY_DEVICE": "tpu"}),  # model
    ("PARLEY_QUANTIZE", {"PARLEY_QUANTIZE": "int8", "PARLEY_DEVICE": "cuda"}),
    ("PARLEY_CONTEXT_WINDOW_S", {"PARLEY_CONTEXT_WINDOW_S": "5"}),  # context
    ("PARLEY_BATCH_WAIT_MS", {"PARLEY_BATCH_WAIT_MS": "-1"}),  # scheduler
    ("PARLEY_MAX_QUEUE", {"PARLEY_MAX_QUEUE": "4", "PARLEY_MAX_BATCH_SIZE": "8"}),
    ("PARLEY_VAD_THRESHOLD", {"PARLEY_VAD_THRESHOLD": "1.5"}),  # segmenter
    ("PARLEY_MAX_UTTERANCE_S", {"PARLEY_MAX_UTTERANCE_S": "31"}),
    ("PARLEY_DIARIZATION_MAX_SPEAKERS", {"PARLEY_DIARIZATION_MAX_SPEAKERS": "27"}),  # speakers
    ("PARLEY_MAX_SESSIONS", {"PARLEY_MAX_SESSIONS": "0"}),  # streams
    ("PARLEY_TOKEN_TTL_S", {"PARLEY_TOKEN_TTL_S": "nan"}),  # auth
    ("PARLEY_UPLOAD_SANDBOX", {"PARLEY_UPLOAD_SANDBOX": "docker"}),  # uploads
    ("PARLEY_STORE_PREFIX", {"PARLEY_STORE_PREFIX": "two words"}),  # store
    ("PARLEY_PROMPT_TOKENS", {"PARLEY_MODEL": "base", "PARLEY_PROMPT_TOKENS": "220"}),  # across
]


@pytest.mark.parametrize(("variable", "env"), REFUSED, ids=[v for v, _ in REFUSED])
def test_each_group_refuses_a_bad_value_naming_variable_value_and_what_is_allowed(
    variable: str, env: dict[str, str]
) -> None:
    """A refusal is a SettingError on one line: `PARLEY_X=<value>: <what is allowed>`."""
    with pytest.raises(ValueError, match=variable) as refused:
        Settings.from_env(env)
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"{variable}=")
    assert env[variable] in message


def test_combinations_are_refused_and_their_edges_allowed() -> None:
    """Checks that read two fields: the queue holds a batch, an utterance is at least
    twice the silence that ends it, int8 only on the CPU in float32 (and `int8` with a
    float32 encoder), the multilingual model's prompt a token shorter."""
    assert Settings.from_env({"PARLEY_MAX_QUEUE": "8", "PARLEY_MAX_BATCH_SIZE": "8"})
    with pytest.raises(SettingError, match="PARLEY_MAX_QUEUE=7: must be >= PARLEY_MAX_BATCH"):
        Settings.from_env({"PARLEY_MAX_QUEUE": "7", "PARLEY_MAX_BATCH_SIZE": "8"})
    long_silence = {"PARLEY_MIN_SILENCE_MS": "5000"}
    assert Settings.from_env({**long_silence, "PARLEY_MAX_UTTERANCE_S": "10"})
    with pytest.raises(SettingError, match=r"PARLEY_MAX_UTTERANCE_S=9.0: must lie in \[10, 30\]"):
        Settings.from_env({**long_silence, "PARLEY_MAX_UTTERANCE_S": "9"})
    for env in (
        {"PARLEY_QUANTIZE": "int8-shortlist", "PARLEY_DTYPE": "float16"},
        {"PARLEY_PARTIAL_QUANTIZE": "int8-decoder", "PARLEY_DEVICE": "cuda"},
        {"PARLEY_QUANTIZE": "int8", "PARLEY_ENCODER_DTYPE": "bfloat16"},
    ):
        with pytest.raises(SettingError, match="QUANTIZE"):
            Settings.from_env(env)
    assert Settings.from_env({"PARLEY_QUANTIZE": "int8", "PARLEY_DEVICE": "cpu"})
    assert Settings.from_env({"PARLEY_QUANTIZE": "none", "PARLEY_DEVICE": "cuda"})
    assert Settings.from_env({"PARLEY_PROMPT_TOKENS": "220"}).context.prompt_tokens == 220
    assert Settings.from_env({"PARLEY_MODEL": "base", "PARLEY_PROMPT_TOKENS": "219"})
    with pytest.raises(SettingError, match="PARLEY_PROMPT_TOKENS=221"):
        Settings.from_env({"PARLEY_PROMPT_TOKENS": "221"})


def test_the_groups_bounds_are_the_ones_the_components_accept() -> None:
    """What the settings allow, the segmenter, the diarizer and the scheduler accept at
    its edges (they used to refuse such values in the model loader's task, after the
    load), and what they refuse, the settings refuse first."""
    from bench.fake_recognizer import FakeRecognizer
    from engine.scheduling.scheduler import BatchScheduler
    from server.app import segmenter_config
    from session.diarizer import DiarizerConfig
    from session.segmenter import SegmenterConfig
    from tests.support.scheduling import scheduler_config

    edges = Settings.from_env(
        {
            "PARLEY_VAD_THRESHOLD": "0.1501",
            "PARLEY_MAX_UTTERANCE_S": "8",
            "PARLEY_MIN_SILENCE_MS": "0",
            "PARLEY_PRE_ROLL_MS": "0",
            "PARLEY_PARTIAL_INTERVAL_S": "0",
            "PARLEY_DIARIZATION_MAX_SPEAKERS": "26",
            "PARLEY_BATCH_WAIT_MS": "0",
        }
    )
    assert segmenter_config(edges).max_utterance == 8
    assert Settings.from_env({"PARLEY_MAX_UTTERANCE_S": "30", "PARLEY_VAD_THRESHOLD": "0.99"})
    assert DiarizerConfig(max_speakers=edges.speakers.diarization_max_speakers)
    BatchScheduler(
        FakeRecognizer(), scheduler_config(max_wait=edges.scheduler.batch_wait_ms / 1000)
    )
    for field_name, value, variable in (
        ("threshold", 0.15, "PARLEY_VAD_THRESHOLD"),
        ("max_utterance", 7.9, "PARLEY_MAX_UTTERANCE_S"),
        ("max_utterance", 30.1, "PARLEY_MAX_UTTERANCE_S"),
    ):
        with pytest.raises(ValueError):
            SegmenterConfig(**{field_name: value})
        with pytest.raises(SettingError, match=variable):
            Settings.from_env({variable: str(value)})
    for speakers in (0, 27):
        with pytest.raises(ValueError):
            DiarizerConfig(max_speakers=speakers)
        with pytest.raises(SettingError, match="PARLEY_DIARIZATION_MAX_SPEAKERS"):
            Settings.from_env({"PARLEY_DIARIZATION_MAX_SPEAKERS": str(speakers)})
    with pytest.raises(ValueError):
        BatchScheduler(FakeRecognizer(), scheduler_config(max_wait=-0.001))


def test_overrides_go_to_their_group_and_an_unknown_name_is_an_error() -> None:
    """`from_env(**overrides)` takes flat field names (tests and benches build settings
    so) and routes each to its group; a name no group has is a TypeError."""
    settings = Settings.from_env({}, max_sessions=3, vad_threshold=0.6, store_prefix="t:")
    assert settings.streams.max_sessions == 3
    assert settings.segmenter.vad_threshold == 0.6
    assert settings.store.store_prefix == "t:"
    with pytest.raises(TypeError, match="max_sesions"):
        Settings.from_env({}, max_sesions=3)
    with pytest.raises(SettingError, match="PARLEY_MAX_SESSIONS=0"):
        Settings.from_env({}, max_sessions=0)


def test_every_setting_is_in_one_group_and_secrets_stay_out_of_reprs() -> None:
    """Field names are unique across groups (each is one variable); an API key does not
    show in the settings' repr (which a log line might print)."""
    names = [name for name, _, _ in Settings.describe()]
    assert len(names) == len(set(names)) == len(field_groups())
    titles = [title for title, _ in Settings.describe_groups()]
    assert len(titles) == len(set(titles)) == len(dataclasses.fields(Settings))
    settings = Settings.from_env({"PARLEY_API_KEYS": "acme:0123456789abcdef0123"})
    assert "0123456789abcdef" not in repr(settings)


def test_cli_help_and_docs_show_the_groups() -> None:
    """`--help` and docs/configuration.md list the settings under their groups' titles."""
    out = subprocess.run(
        [sys.executable, "-m", "server", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    doc = (REPO / "docs" / "configuration.md").read_text()
    for title, rows in Settings.describe_groups():
        assert f"\n{title}:\n" in out and f"\n## {title}\n" in doc
        section = out.split(f"\n{title}:\n", 1)[1].split("\n\n", 1)[0]
        assert all(name in section for name, _, _ in rows)


# All the processes start at once and import torch; on a loaded 2-core box that is minutes.
START_TIMEOUT = 480 * S

# What create_app refuses at start (it reads files, or asks the machine), beside REFUSED.
REFUSED_AT_START: list[tuple[str, dict[str, str]]] = [
    ("PARLEY_API_KEYS", {"PARLEY_API_KEYS": "no-colon-here"}),
    ("PARLEY_API_KEYS_FILE", {"PARLEY_API_KEYS_FILE": "/nonexistent/keys"}),
    ("PARLEY_UPLOAD_DIR", {"PARLEY_UPLOAD_DIR": "/dev/null/uploads"}),  # under a file
]


@pytest.mark.slow
def test_the_server_refuses_each_class_of_bad_setting_at_start() -> None:
    """`python -m server` with one bad value (or bad combination) of each group: exit 2
    before serving, one line on stderr naming the variable, and no traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARLEY_")}
    cases = REFUSED + REFUSED_AT_START
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "server", "--port", "0"],
            cwd=REPO,
            env={**env, "PARLEY_LOG_FORMAT": "text", **bad},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _, bad in cases
    ]
    try:
        for (variable, bad), process in zip(cases, processes, strict=True):
            stdout, stderr = process.communicate(timeout=START_TIMEOUT)
            lines = stderr.strip().splitlines()
            assert process.returncode == 2, (bad, stderr)
            assert len(lines) == 1 and stdout == "", (bad, stderr)
            assert lines[0].startswith(f"configuration error: {variable}"), (bad, stderr)
    finally:
        for process in processes:  # one that started serving after all
            if process.poll() is None:
                process.kill()
                process.communicate()


async def test_a_failure_after_the_load_is_logged_and_reported_by_readyz(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Whatever fails in the model loader's task, after the load as well (here the
    recognizer's warm-up), is logged with its traceback, and /readyz answers 503 with the
    reason instead of "loading" for ever."""
    from bench.fake_recognizer import FakeRecognizer
    from tests.support.appserver import serve_app

    class ColdRecognizer(FakeRecognizer):
        def warmup(self) -> None:
            raise ValueError("the warm-up failed")

    caplog.set_level(logging.ERROR, logger="server.app")
    async with serve_app(lambda settings: ColdRecognizer()) as server:
        status, _, body = await server.request("GET", "/readyz")
    ready = orjson.loads(body)
    assert status == 503 and ready["ready"] is False
    assert ready["checks"]["model"] == "failed"
    assert any(r.startswith("model failed to load: ValueError: ") for r in ready["reasons"])
    failed = [r for r in caplog.records if r.getMessage() == "model failed to load"]
    assert len(failed) == 1 and failed[0].exc_info is not None
