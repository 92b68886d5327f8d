"""A Whisper checkpoint loaded for the recognizer: the model, its int8 layers and heads,
its windowed encoders, and the special tokens its prompts are made of.

`WhisperModel` loads a checkpoint folder (`engine.whisper.weights.resolve_model`) with
transformers, refuses one that does not load cleanly, freezes it on its device, and
builds what `engine.whisper.recognizer`'s batch pipeline runs:

- the layers `quantize` names in int8 (`engine.whisper.int8`), before the encoder windows are
  built, since those share the model's layers (`engine.whisper.windows`); the encoder in its own
  dtype where `encoder_dtype` says so;
- the greedy decoder (`engine.whisper.greedy`) over the vocabulary head: every logit, or under
  `int8-shortlist` an int8 shortlist rescored in float32 (`engine.whisper.vocabulary`);
- for `partial_quantize`, a second greedy decoder for batches of partials, over int8
  copies of the decoder's layers and projection (the shortlist's int8 projection where
  there is one: one copy, not two);
- the reader of the first decoder position (`engine.whisper.first_step`: no-speech probability,
  language) and the word aligner (`engine.whisper.alignment`), if the checkpoint has alignment
  heads;
- the tokens of each row's prompt: [<|startofprev|>, the previous text,]
  <|startoftranscript|>, [language, task,] <|notimestamps|>, [the left context's text,]
  then the decoded tokens. The longest prompt must leave room for the longest decoding.

It never sets torch's thread count; the process that owns it decides.
"""

from __future__ import annotations

import copy
import functools
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import torch
from transformers import (
    GenerationConfig,
    WhisperFeatureExtractor,
    WhisperForConditionalGeneration,
    WhisperTokenizer,
)

from engine.api import Utterance
from engine.whisper.alignment import Aligner
from engine.whisper.config import ENGLISH, INT8_LAYERS, WhisperRecognizerConfig
from engine.whisper.first_step import FirstStep
from engine.whisper.greedy import GreedyDecoder
from engine.whisper.int8 import Int8Linear, quantize_linears
from engine.whisper.keyterms import MAX_TOKENS, PROMPT_TOKENS
from engine.whisper.vocabulary import FullHead, ShortlistHead, VocabularyHead
from engine.whisper.windows import WindowedEncoders

logger = logging.getLogger(__name__)


class WhisperModel:
    """A Whisper checkpoint folder, loaded and built for decoding (see the module doc)."""

    def __init__(self, model_path: Path, config: WhisperRecognizerConfig, name: str) -> None:
        self.name = name
        self.device = torch.device(config.device)
        loaded = WhisperForConditionalGeneration.from_pretrained(
            model_path,
            dtype=config.torch_dtype,
            local_files_only=True,
            output_loading_info=True,
        )
        # output_loading_info=True makes it a (model, info) pair, which the stubs do not say.
        model, info = cast(tuple[WhisperForConditionalGeneration, dict[str, Any]], loaded)
        problems = {k: info[k] for k in ("missing_keys", "mismatched_keys") if info[k]}
        if problems:
            raise ValueError(f"{model_path} does not load cleanly: {problems}")
        if info["unexpected_keys"]:
            logger.warning("%s: ignoring unexpected keys %s", model_path, info["unexpected_keys"])
        # nn.Module.to and .eval work in place (transformers' typed wrappers of them do not
        # type-check); the model is frozen and in inference mode from here on.
        torch.nn.Module.to(model, self.device)
        torch.nn.Module.eval(model)
        model.requires_grad_(False)
        if config.quantize in INT8_LAYERS:
            # Before the windows are built: they share the model's (int8) layers.
            replaced = quantize_linears(model, INT8_LAYERS[config.quantize])
            logger.info("%s: %d linear layers in int8", name, replaced)
        if config.encoder_torch_dtype != config.torch_dtype:
            torch.nn.Module.to(model.model.encoder, config.encoder_torch_dtype)
        if config.encoder_torch_dtype == torch.bfloat16 and self.device.type == "cpu":
            # The encoder is the only part transformers runs; torch's CPU flash attention
            # in bfloat16 is slower than plain matrix products
            # (docs/performance.md#the-models-arithmetic).
            model.set_attn_implementation("eager")
        self.model = model
        self.encoders = WindowedEncoders(
            model.model.encoder, (*config.windows, *config.partial_windows)
        )
        self.features = WhisperFeatureExtractor.from_pretrained(model_path, local_files_only=True)
        if self.features.feature_size != model.config.num_mel_bins:
            raise ValueError("feature extractor and model disagree on the number of mel bins")
        self.tokenizer = WhisperTokenizer.from_pretrained(model_path, local_files_only=True)
        generation: GenerationConfig = model.generation_config
        self.multilingual = bool(getattr(generation, "is_multilingual", False))
        self.lang_to_id: dict[str, int] = {
            token[2:-2]: index for token, index in getattr(generation, "lang_to_id", {}).items()
        }
        if self.multilingual and not self.lang_to_id:
            raise ValueError(f"{model_path}: a multilingual model without lang_to_id")
        self.sot = _token_setting(generation, "decoder_start_token_id")
        self.eot = _token_setting(generation, "eos_token_id")
        # Whisper's no-speech token sits just below <|notimestamps|> in every vocabulary.
        no_timestamps = _token_setting(generation, "no_timestamps_token_id")
        self.first_step = FirstStep(
            name, no_timestamps - 1, self.lang_to_id if self.multilingual else None, self.device
        )
        # The prompt after <|startoftranscript|>: [language, task,] <|notimestamps|>.
        self.prompt_tail = [no_timestamps]
        if self.multilingual:
            task_to_id: dict[str, int] = getattr(generation, "task_to_id", {})
            if "transcribe" not in task_to_id:
                raise ValueError(f"{model_path}: a multilingual model without task_to_id")
            self.prompt_tail = [task_to_id["transcribe"], no_timestamps]
        self.greedy, self.partial_greedy = self._greedy_decoders(config, generation)
        self.max_new_tokens_cap = model.config.max_target_positions // 2
        self.prev = _token_setting(generation, "prev_sot_token_id")
        # <|startofprev|>, the prompt, <|startoftranscript|>, [language,] the tail, the
        # tokens: the longest prompt (`prefix`) must leave room for the longest decoding.
        self._prompt_tokens = config.prompt_tokens
        self._prefix_tokens = max(config.prompt_tokens, PROMPT_TOKENS)  # `prefix`'s most
        longest = 3 + len(self.prompt_tail) + self._prefix_tokens + self.max_new_tokens_cap
        if longest > self.greedy.max_positions:
            room = self.greedy.max_positions - longest + self._prefix_tokens
            raise ValueError(f"prompt_tokens must be at most {room} for this model")
        self.aligner = self._build_aligner(config, generation, model_path)
        encoder = config.encoder_torch_dtype
        logger.info(
            "loaded %s on %s (%s%s%s), windows %s s",
            name,
            self.device,
            config.torch_dtype,
            "" if encoder == config.torch_dtype else f", encoder {encoder}",
            "" if config.quantize == "none" else f", {config.quantize}",
            self.encoders.windows,
        )

    def _greedy_decoders(
        self, config: WhisperRecognizerConfig, generation: GenerationConfig
    ) -> tuple[GreedyDecoder, GreedyDecoder]:
        """The finals' greedy decoder, and the partials' (the same one, or int8 copies of
        the decoder's layers and projection under `partial_quantize`)."""
        projection = self.model.proj_out
        # int8-shortlist: float32's tokens from an int8 shortlist (engine.whisper.vocabulary).
        head: VocabularyHead = FullHead(projection)
        if config.quantize == "int8-shortlist":
            head = ShortlistHead(projection)
        decoder = self.model.model.decoder
        greedy = functools.partial(
            GreedyDecoder,
            decoder,
            start_token=self.sot,
            end_token=self.eot,
            suppress_tokens=list(generation.suppress_tokens or []),
            begin_suppress_tokens=list(generation.begin_suppress_tokens or []),
            graphs=config.decoder_graphs,
        )
        finals = greedy(head)
        if not config.int8_partials:
            return finals, finals
        layers = [copy.deepcopy(layer) for layer in decoder.layers]
        replaced = sum(quantize_linears(layer) for layer in layers)
        # The shortlist's int8 projection where there is one (one copy, not two).
        int8 = head.int8 if isinstance(head, ShortlistHead) else Int8Linear(projection)
        partials = greedy(FullHead(int8), layers=layers)
        logger.info("%s: partials decode through %d int8 layers", self.name, replaced + 1)
        return finals, partials

    def _build_aligner(
        self, config: WhisperRecognizerConfig, generation: GenerationConfig, model_path: Path
    ) -> Aligner | None:
        if not config.word_timings:
            return None
        heads = getattr(generation, "alignment_heads", None)
        if not heads:
            logger.warning("%s has no alignment heads: finals carry no word timings", model_path)
            return None
        strings = self.tokenizer.convert_ids_to_tokens(list(range(self.eot)))
        return Aligner(self.model.model.decoder, heads, strings, end_token=self.eot)

    @property
    def languages(self) -> frozenset[str]:
        """Every language code the model knows; just `en` for an English-only model."""
        return frozenset(self.lang_to_id) if self.multilingual else frozenset({ENGLISH})

    def pinned_languages(self, batch: Sequence[Utterance]) -> list[str] | None:
        """Each row's language where every one is known before decoding (an English-only
        model, or pinned ones), else None (some row's is to be detected)."""
        if not self.multilingual:
            return [ENGLISH] * len(batch)
        languages = [utterance.language for utterance in batch]
        for language in languages:
            if language is not None and language not in self.lang_to_id:
                raise ValueError(f"{self.name} does not know language {language!r}")
        return None if None in languages else cast(list[str], languages)

    def prompt_row(self, language: str) -> list[int]:
        """The prompt after <|startoftranscript|>: [language, task,] <|notimestamps|>."""
        if self.multilingual:
            return [self.lang_to_id[language], *self.prompt_tail]
        return list(self.prompt_tail)

    def prefix(self, prompt: str, keyterms: Sequence[str] = ()) -> list[int]:
        """What an utterance reads before <|startoftranscript|>: <|startofprev|>, its
        keyterms as a list (`engine.whisper.keyterms`, at most `PROMPT_TOKENS` of them,
        whatever `prompt_tokens` is) and the last tokens of its prompt (Whisper's condition
        on previous text, at most `prompt_tokens`), the larger of the two bounds in all
        (the terms first), or nothing."""
        terms = self.draft_tokens(", ".join(keyterms) + ".")[:PROMPT_TOKENS] if keyterms else []
        keep = min(self._prompt_tokens, self._prefix_tokens - len(terms))
        tokens = self.draft_tokens(prompt)[-keep:] if keep else []
        return [self.prev, *terms, *tokens] if terms or tokens else []

    def term_tokens(self, keyterms: Sequence[str]) -> list[list[int]]:
        """Each keyterm's tokens as the model writes it after a space (the sequences
        `engine.whisper.keyterms` boosts), `MAX_TOKENS` in all at most."""
        out: list[list[int]] = []
        room = MAX_TOKENS
        for term in keyterms:
            tokens = self.draft_tokens(term)
            if len(tokens) > room:
                break
            room -= len(tokens)
            if tokens:
                out.append(tokens)
        return out

    def draft_tokens(self, text: str) -> list[int]:
        """A draft's tokens as the model would write them (text after a space)."""
        if not text.strip():
            return []
        ids: list[int] = self.tokenizer.encode(" " + text.strip(), add_special_tokens=False)
        return [token for token in ids if token < self.eot]

    def text(self, tokens: list[int]) -> str:
        """The text of decoded tokens, special tokens skipped, without outer spaces."""
        return str(self.tokenizer.decode(tokens, skip_special_tokens=True)).strip()

    def spell(self, token: int) -> str:
        """One token as the tokenizer writes it."""
        return str(self.tokenizer.decode([token]))


def _token_setting(generation: GenerationConfig, name: str) -> int:
    value = getattr(generation, name, None)
    if not isinstance(value, int):
        raise ValueError(f"the generation config has no {name}: not a Whisper model's")
    return value
