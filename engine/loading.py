"""Loading the speech model: a `ModelConfig` in, a Recognizer out (blocking; seconds).

The server builds the `ModelConfig` from its Settings; nothing here reads the environment.
torch and transformers are imported when a model is loaded, not when this module is, so
the server starts and answers `/healthz` while the model loads in the background.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from engine.recognizer import Recognizer

if TYPE_CHECKING:
    from engine.whisper import WhisperRecognizer, WhisperRecognizerConfig

DEFAULT_MODEL = "tiny.en"
DEFAULT_CACHE = Path("~/.cache/parley/models")

DType = Literal["auto", "float32", "float16", "bfloat16"]


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Which model to load and how to run it.

    `model` is a packaged name (`tiny.en`, `base`), a Hugging Face Whisper folder, or a
    hub id already in the local hub cache. Packaged models are converted once into
    `cache`. `device="auto"` picks cuda when present; `dtype="auto"` is float32 on the CPU
    and float16 on cuda. `torch_threads=0` uses every core.
    """

    model: str = DEFAULT_MODEL
    cache: Path = DEFAULT_CACHE
    device: str = "auto"  # or "cpu", "cuda", "cuda:1"
    dtype: DType = "auto"
    int8: bool = False
    drafts: bool = True
    torch_threads: int = 0
    max_batch_size: int = 16


def load_whisper(config: ModelConfig) -> Recognizer:
    """The default recognizer: Whisper through torch + transformers."""
    import torch

    from engine.whisper import WhisperRecognizerConfig

    # silero_vad's import (if anything imports it) sets 1 thread process-wide: set ours last.
    torch.set_num_threads(config.torch_threads or os.cpu_count() or 1)
    device = config.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    whisper = WhisperRecognizerConfig(
        device=device,
        dtype=None if config.dtype == "auto" else config.dtype,
        max_batch_size=config.max_batch_size,
        int8=config.int8,
        drafts=config.drafts,
    )
    return load_recognizer(config.model, whisper, cache=config.cache)


def load_recognizer(
    spec: str = DEFAULT_MODEL,
    config: WhisperRecognizerConfig | None = None,
    *,
    cache: Path = DEFAULT_CACHE,
) -> WhisperRecognizer:
    """`resolve_model(spec, cache)` (converting a packaged model once), as a recognizer."""
    from engine.weights import resolve_model
    from engine.whisper import WhisperRecognizer

    return WhisperRecognizer(resolve_model(spec, cache), config, name=spec)
