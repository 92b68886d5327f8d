"""CTranslate2 Whisper → transformers Whisper: the exact mapping of weights, config and tokens.

`engine/whisper/weights.py` finds a model and drives the conversion; this module is the mapping
itself, from a CTranslate2 model already read (`engine.whisper.ct2.read_model`): fused QKV / KV
projections are split, layer norms renamed, the output projection tied to the token
embedding (CTranslate2 stores it as an alias). Every CTranslate2 variable must be used and
every transformers parameter filled, or it raises `WeightMappingError`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import (
    AddedToken,
    GenerationConfig,
    WhisperConfig,
    WhisperForConditionalGeneration,
    WhisperTokenizer,
)

from engine.whisper.ct2 import Ct2Model

WHISPER_SPEC = "WhisperSpec"
_GELU = 3  # CTranslate2 ActivationType::GELU (erf form), what transformers' "gelu" computes
# Scalars that describe the architecture rather than hold weights: checked, then dropped.
_EXPECTED_SCALARS = {
    "decoder/activation": _GELU,
    "decoder/alibi": 0,
    "decoder/pre_norm": 1,
    "decoder/scale_embeddings": 0,
    "decoder/start_from_zero_embedding": 0,
}
# The same, written only by newer CTranslate2 releases (ALiBi options, moot with alibi 0).
_OPTIONAL_SCALARS = {
    "decoder/alibi_use_positive_positions": 0,
    "decoder/scale_alibi": 0,
}
# Read into the config (heads) or taken from config.json instead (alignment heads).
_CONFIG_SCALARS = (
    "decoder/num_heads",
    "encoder/num_heads",
    "decoder/alignment_heads",
    "decoder/alignment_layer",
)
_TIED_KEY = "proj_out.weight"
_EMBEDDING_KEY = "model.decoder.embed_tokens.weight"
_MULTILINGUAL_VOCAB = 51865  # English-only Whisper vocabularies are one token smaller


class WeightMappingError(ValueError):
    """The CTranslate2 variables do not map one-to-one onto the transformers model."""


def tokenizer(tokenizer_file: Path, vocabulary_file: Path) -> WhisperTokenizer:
    """The fast tokenizer, completed with the timestamp tokens `tokenizer.json` lacks."""
    tokenizer = WhisperTokenizer(tokenizer_file=str(tokenizer_file))
    vocabulary = _vocabulary(vocabulary_file)
    missing = vocabulary[len(tokenizer) :]
    if missing:
        tokenizer.add_tokens([AddedToken(token, normalized=False) for token in missing])
    if len(tokenizer) != len(vocabulary):
        raise WeightMappingError(
            f"tokenizer has {len(tokenizer)} tokens, vocabulary.txt {len(vocabulary)}"
        )
    mismatched = [
        (index, token)
        for index, token in enumerate(vocabulary)
        if index >= 50_000 and tokenizer.convert_ids_to_tokens(index) != token
    ]
    if mismatched:
        raise WeightMappingError(f"tokenizer ids disagree with vocabulary.txt: {mismatched[:3]}")
    return tokenizer


def _vocabulary(path: Path) -> list[str]:
    """CTranslate2's vocabulary: `vocabulary.txt` one token a line, or a JSON list."""
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".json":
        return text.splitlines()
    tokens = json.loads(text)
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise WeightMappingError(f"{path} is not a JSON list of tokens")
    return tokens


def _layer_count(ct2: Ct2Model, stack: str) -> int:
    indices = {
        int(match.group(1))
        for name in ct2.variables
        if (match := re.match(rf"{stack}/layer_(\d+)/", name))
    }
    if indices != set(range(len(indices))):
        raise WeightMappingError(f"{stack} layers are not numbered 0..n-1: {sorted(indices)}")
    return len(indices)


def whisper_config(ct2: Ct2Model, tokenizer: WhisperTokenizer) -> WhisperConfig:
    """The transformers config, read off the CTranslate2 variables' shapes and scalars."""
    for name, expected in _EXPECTED_SCALARS.items():
        if ct2.scalar(name) != expected:
            raise WeightMappingError(f"{name} = {ct2.scalar(name)}, expected {expected}")
    for name, expected in _OPTIONAL_SCALARS.items():
        if name in ct2.variables and ct2.scalar(name) != expected:
            raise WeightMappingError(f"{name} = {ct2.scalar(name)}, expected {expected}")
    vocab_size, d_model = ct2.variables["decoder/embeddings/weight"].shape
    if vocab_size != len(tokenizer):
        raise WeightMappingError(f"embedding has {vocab_size} rows, tokenizer {len(tokenizer)}")
    eot = _token_id(tokenizer, "<|endoftext|>")
    sot = _token_id(tokenizer, "<|startoftranscript|>")
    return WhisperConfig(
        vocab_size=vocab_size,
        num_mel_bins=ct2.variables["encoder/conv1/weight"].shape[1],
        d_model=d_model,
        encoder_layers=_layer_count(ct2, "encoder"),
        decoder_layers=_layer_count(ct2, "decoder"),
        encoder_attention_heads=ct2.scalar("encoder/num_heads"),
        decoder_attention_heads=ct2.scalar("decoder/num_heads"),
        encoder_ffn_dim=ct2.variables["encoder/layer_0/ffn/linear_0/weight"].shape[0],
        decoder_ffn_dim=ct2.variables["decoder/layer_0/ffn/linear_0/weight"].shape[0],
        max_source_positions=ct2.variables["encoder/position_encodings/encodings"].shape[0],
        max_target_positions=ct2.variables["decoder/position_encodings/encodings"].shape[0],
        pad_token_id=eot,
        bos_token_id=eot,
        eos_token_id=eot,
        decoder_start_token_id=sot,
        begin_suppress_tokens=None,
        suppress_tokens=None,
        tie_word_embeddings=True,
    )


class _Mapper:
    """Moves CTranslate2 variables into a transformers state dict, recording each one used."""

    def __init__(self, ct2: Ct2Model) -> None:
        self.ct2 = ct2
        self.used: set[str] = set()
        self.state: dict[str, torch.Tensor] = {}

    def take(self, name: str) -> torch.Tensor:
        if name not in self.ct2.variables:
            raise WeightMappingError(f"CTranslate2 model lacks {name}")
        self.used.add(name)
        return self.ct2.variables[name]

    def copy(self, source: str, target: str) -> None:
        self.state[target] = self.take(source)

    def linear(self, source: str, target: str) -> None:
        self.copy(f"{source}/weight", f"{target}.weight")
        self.copy(f"{source}/bias", f"{target}.bias")

    def layer_norm(self, source: str, target: str) -> None:
        self.copy(f"{source}/gamma", f"{target}.weight")
        self.copy(f"{source}/beta", f"{target}.bias")

    def fused(self, source: str, targets: Sequence[str]) -> None:
        """Split a fused projection; transformers' k_proj has no bias, so its part must be 0."""
        weights = self.take(f"{source}/weight").chunk(len(targets), dim=0)
        biases = self.take(f"{source}/bias").chunk(len(targets), dim=0)
        for target, weight, bias in zip(targets, weights, biases, strict=True):
            self.state[f"{target}.weight"] = weight.clone()
            if target.endswith("k_proj"):
                if bool(bias.any()):
                    raise WeightMappingError(f"{source}: key bias is not zero")
            else:
                self.state[f"{target}.bias"] = bias.clone()

    def layer(self, source: str, target: str, *, cross_attention: bool) -> None:
        self.layer_norm(f"{source}/self_attention/layer_norm", f"{target}.self_attn_layer_norm")
        self.fused(
            f"{source}/self_attention/linear_0",
            [f"{target}.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj")],
        )
        self.linear(f"{source}/self_attention/linear_1", f"{target}.self_attn.out_proj")
        if cross_attention:
            self.layer_norm(f"{source}/attention/layer_norm", f"{target}.encoder_attn_layer_norm")
            self.linear(f"{source}/attention/linear_0", f"{target}.encoder_attn.q_proj")
            self.fused(
                f"{source}/attention/linear_1",
                [f"{target}.encoder_attn.{p}" for p in ("k_proj", "v_proj")],
            )
            self.linear(f"{source}/attention/linear_2", f"{target}.encoder_attn.out_proj")
        self.layer_norm(f"{source}/ffn/layer_norm", f"{target}.final_layer_norm")
        self.linear(f"{source}/ffn/linear_0", f"{target}.fc1")
        self.linear(f"{source}/ffn/linear_1", f"{target}.fc2")


def hf_state_dict(ct2: Ct2Model) -> dict[str, torch.Tensor]:
    """transformers parameter names → tensors; raises if any CTranslate2 variable is left."""
    mapper = _Mapper(ct2)
    mapper.used.update(_EXPECTED_SCALARS)
    mapper.used.update(name for name in _OPTIONAL_SCALARS if name in ct2.variables)
    mapper.used.update(_CONFIG_SCALARS)
    for stack in ("encoder", "decoder"):
        for index in range(_layer_count(ct2, stack)):
            mapper.layer(
                f"{stack}/layer_{index}",
                f"model.{stack}.layers.{index}",
                cross_attention=stack == "decoder",
            )
        mapper.copy(
            f"{stack}/position_encodings/encodings", f"model.{stack}.embed_positions.weight"
        )
        mapper.layer_norm(f"{stack}/layer_norm", f"model.{stack}.layer_norm")
    mapper.linear("encoder/conv1", "model.encoder.conv1")
    mapper.linear("encoder/conv2", "model.encoder.conv2")
    mapper.copy("decoder/embeddings/weight", _EMBEDDING_KEY)
    if ct2.aliases.get("decoder/projection/weight") != "decoder/embeddings/weight":
        raise WeightMappingError("the output projection is not tied to the token embedding")
    left = sorted(set(ct2.variables) - mapper.used)
    if left:
        raise WeightMappingError(f"CTranslate2 variables left unmapped: {left}")
    return mapper.state


def load_strict(
    config: WhisperConfig, state: dict[str, torch.Tensor]
) -> WhisperForConditionalGeneration:
    """A model holding exactly `state`: no parameter missing, none extra, every shape equal."""
    with torch.device("meta"):
        model = WhisperForConditionalGeneration(config)
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    missing = sorted(set(expected) - set(state) - {_TIED_KEY})
    unexpected = sorted(set(state) - set(expected))
    mismatched = sorted(
        f"{name}: {tuple(tensor.shape)} != {expected[name]}"
        for name, tensor in state.items()
        if name in expected and tuple(tensor.shape) != expected[name]
    )
    if missing or unexpected or mismatched:
        raise WeightMappingError(
            f"missing {missing}, unexpected {unexpected}, mismatched shapes {mismatched}"
        )
    model.load_state_dict({**state, _TIED_KEY: state[_EMBEDDING_KEY]}, strict=True, assign=True)
    model.tie_weights()
    if model.proj_out.weight.data_ptr() != model.model.decoder.embed_tokens.weight.data_ptr():
        raise WeightMappingError("output projection did not tie to the token embedding")
    torch.nn.Module.eval(model)
    return model


def _token_id(tokenizer: WhisperTokenizer, token: str) -> int:
    value = tokenizer.convert_tokens_to_ids(token)
    # An unknown token maps to the unknown token's id, which in Whisper is <|endoftext|>.
    if not isinstance(value, int) or tokenizer.convert_ids_to_tokens(value) != token:
        raise WeightMappingError(f"tokenizer lacks {token}")
    return value


def _token(tokenizer: WhisperTokenizer, index: int) -> str:
    value = tokenizer.convert_ids_to_tokens(index)
    if not isinstance(value, str):
        raise WeightMappingError(f"tokenizer has no token {index}")
    return value


def generation_config(
    ct2_config: dict[str, object], tokenizer: WhisperTokenizer, config: WhisperConfig
) -> GenerationConfig:
    """What `generate()` needs: special tokens, suppressions, alignment heads, languages."""
    sot = _token_id(tokenizer, "<|startoftranscript|>")
    multilingual = config.vocab_size >= _MULTILINGUAL_VOCAB
    extra: dict[str, object] = {}
    if multilingual:
        translate = _token_id(tokenizer, "<|translate|>")
        extra["lang_to_id"] = {
            token: index
            for index in range(sot + 1, translate)
            if re.fullmatch(r"<\|[a-z]{2,3}\|>", token := _token(tokenizer, index))
        }
        extra["task_to_id"] = {
            "translate": translate,
            "transcribe": _token_id(tokenizer, "<|transcribe|>"),
        }
    return GenerationConfig(  # type: ignore[no-untyped-call]
        decoder_start_token_id=sot,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        max_length=config.max_target_positions,
        suppress_tokens=list(_int_list(ct2_config, "suppress_ids")),
        begin_suppress_tokens=list(_int_list(ct2_config, "suppress_ids_begin")),
        alignment_heads=[list(pair) for pair in ct2_config["alignment_heads"]],  # type: ignore[attr-defined]
        no_timestamps_token_id=_token_id(tokenizer, "<|notimestamps|>"),
        prev_sot_token_id=_token_id(tokenizer, "<|startofprev|>"),
        max_initial_timestamp_index=50,
        is_multilingual=multilingual,
        return_timestamps=False,
        **extra,
    )


def _int_list(ct2_config: dict[str, object], key: str) -> list[int]:
    values = ct2_config.get(key)
    if not isinstance(values, list) or not all(isinstance(v, int) for v in values):
        raise WeightMappingError(f"config.json {key} is not a list of token ids")
    return values
