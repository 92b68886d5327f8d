"""CTranslate2 → transformers conversion: strict mapping, cache reuse, atomic writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from safetensors import safe_open
from transformers import WhisperConfig, WhisperForConditionalGeneration

from engine.whisper import ct2_mapping, weights
from engine.whisper.ct2 import Ct2Model, read_model
from engine.whisper.weights import (
    PACKAGED_MODELS,
    ModelNotFoundError,
    ModelSource,
    WeightMappingError,
    hf_state_dict,
    load_strict,
    resolve_model,
)


@pytest.fixture(scope="module")
def source() -> ModelSource:
    return PACKAGED_MODELS["tiny.en"]()


@pytest.fixture(scope="module")
def ct2(source: ModelSource) -> Ct2Model:
    return read_model(source.model_parts)


@pytest.fixture(scope="module")
def config(source: ModelSource, ct2: Ct2Model) -> WhisperConfig:
    return ct2_mapping.whisper_config(
        ct2, ct2_mapping.tokenizer(source.tokenizer_file, source.vocabulary_file)
    )


def _without(ct2: Ct2Model, name: str) -> Ct2Model:
    variables = {k: v for k, v in ct2.variables.items() if k != name}
    return Ct2Model(ct2.spec, ct2.revision, variables, ct2.aliases)


def _with(ct2: Ct2Model, name: str, value: torch.Tensor) -> Ct2Model:
    return Ct2Model(ct2.spec, ct2.revision, {**ct2.variables, name: value}, ct2.aliases)


def test_every_variable_fills_every_parameter(ct2: Ct2Model, config: WhisperConfig) -> None:
    """The mapping uses all of tiny.en and loads strictly, output projection tied."""
    model = load_strict(config, hf_state_dict(ct2))
    assert model.proj_out.weight.data_ptr() == model.model.decoder.embed_tokens.weight.data_ptr()
    assert not any(p.is_meta for p in model.parameters())
    q, k, v = ct2.variables["encoder/layer_2/self_attention/linear_0/weight"].chunk(3)
    attention = model.model.encoder.layers[2].self_attn
    assert torch.equal(attention.q_proj.weight, q)
    assert torch.equal(attention.k_proj.weight, k)
    assert torch.equal(attention.v_proj.weight, v)


def test_a_leftover_variable_is_an_error(ct2: Ct2Model) -> None:
    """A CTranslate2 variable the mapping does not use fails the conversion."""
    with pytest.raises(WeightMappingError, match=r"left unmapped.*encoder/extra"):
        hf_state_dict(_with(ct2, "encoder/extra", torch.zeros(3)))


def test_a_missing_variable_is_an_error(ct2: Ct2Model) -> None:
    """A transformers parameter with no CTranslate2 source fails the conversion."""
    with pytest.raises(WeightMappingError, match="lacks encoder/layer_norm/gamma"):
        hf_state_dict(_without(ct2, "encoder/layer_norm/gamma"))


def test_shape_mismatch_and_extra_keys_fail_the_strict_load(
    ct2: Ct2Model, config: WhisperConfig
) -> None:
    """load_strict rejects a wrong shape, a missing key and an unknown key."""
    state = hf_state_dict(ct2)
    with pytest.raises(WeightMappingError, match=r"mismatched shapes.*fc1\.bias"):
        load_strict(config, {**state, "model.encoder.layers.0.fc1.bias": torch.zeros(7)})
    with pytest.raises(WeightMappingError, match=r"missing.*conv1\.bias"):
        load_strict(config, {k: v for k, v in state.items() if k != "model.encoder.conv1.bias"})
    with pytest.raises(WeightMappingError, match=r"unexpected.*model\.extra"):
        load_strict(config, {**state, "model.extra": torch.zeros(1)})


def test_a_nonzero_key_bias_is_an_error(ct2: Ct2Model) -> None:
    """transformers' k_proj has no bias, so a fused bias with a key part cannot convert."""
    name = "decoder/layer_1/attention/linear_1/bias"
    bias = ct2.variables[name].clone()
    bias[0] = 1.0
    with pytest.raises(WeightMappingError, match="key bias is not zero"):
        hf_state_dict(_with(ct2, name, bias))


@pytest.mark.slow
def test_converted_folder_loads_strictly_offline(tiny_en: Path) -> None:
    """The folder has weights, configs and tokenizer; from_pretrained misses nothing."""
    names = {path.name for path in tiny_en.iterdir()}
    assert {
        "model.safetensors",
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "preprocessor_config.json",
    } <= names
    with safe_open(str(tiny_en / "model.safetensors"), framework="pt") as tensors:
        assert "proj_out.weight" not in set(tensors.keys())  # tied, stored once
    loaded = WhisperForConditionalGeneration.from_pretrained(
        tiny_en, local_files_only=True, output_loading_info=True, dtype=torch.float32
    )
    info = cast(tuple[WhisperForConditionalGeneration, dict[str, Any]], loaded)[1]
    assert info == {
        "missing_keys": set(),
        "unexpected_keys": set(),
        "mismatched_keys": set(),
        "error_msgs": [],
    }
    generation = json.loads((tiny_en / "generation_config.json").read_text())
    assert generation["no_timestamps_token_id"] == 50362
    assert generation["is_multilingual"] is False
    assert generation["alignment_heads"][0] == [1, 0]


@pytest.mark.slow
def test_second_resolve_reuses_the_cache(
    tiny_en: Path, model_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Resolving again returns the same folder without converting or rewriting it."""
    before = {path.name: path.stat().st_mtime_ns for path in tiny_en.iterdir()}

    def no_conversion(source: ModelSource, destination: Path) -> None:
        raise AssertionError("converted again")

    monkeypatch.setattr(weights, "convert", no_conversion)
    assert resolve_model("tiny.en", model_cache) == tiny_en
    assert {path.name: path.stat().st_mtime_ns for path in tiny_en.iterdir()} == before
    # A path to a Whisper folder is used as is.
    assert resolve_model(str(tiny_en), model_cache) == tiny_en


def test_failed_conversion_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conversion that dies half-way leaves no model folder and no staging folder."""

    def dies_halfway(source: ModelSource, destination: Path) -> None:
        (destination / "config.json").write_text("{}")
        raise OSError("disk full")

    monkeypatch.setattr(weights, "convert", dies_halfway)
    with pytest.raises(OSError, match="disk full"):
        resolve_model("tiny.en", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_concurrent_conversion_wins_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: ModelSource
) -> None:
    """If another process renames its copy into place first, that copy is used."""
    final = tmp_path / f"{source.name}-{source.fingerprint()}"

    def loses_the_race(source: ModelSource, destination: Path) -> None:
        (destination / "config.json").write_text('{"from": "staging"}')
        final.mkdir()
        (final / "config.json").write_text('{"from": "winner"}')

    monkeypatch.setattr(weights, "convert", loses_the_race)
    assert resolve_model("tiny.en", tmp_path) == final
    assert json.loads((final / "config.json").read_text()) == {"from": "winner"}
    assert [path.name for path in tmp_path.iterdir()] == [final.name]


def test_unknown_specs_are_refused(tmp_path: Path) -> None:
    """Unknown names, non-Whisper folders and uncached hub ids raise ModelNotFoundError."""
    with pytest.raises(ModelNotFoundError, match="unknown model"):
        resolve_model("tiny", tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(ModelNotFoundError, match="not whisper"):
        resolve_model(str(tmp_path), tmp_path)
    with pytest.raises(ModelNotFoundError, match="not in the local hub cache"):
        resolve_model("openai/whisper-does-not-exist", tmp_path)
