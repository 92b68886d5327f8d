"""Loading the speech model: a `ModelConfig` in, a Recognizer out (blocking; seconds).

The server builds the `ModelConfig` from its Settings; nothing here reads the environment.
torch and transformers are imported when a model is loaded, not when this module is, so
the server starts and answers `/healthz` while the model loads in the background.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from engine.choices import DType, DTypeChoice, PartialQuantizeChoice, Quantize, QuantizeChoice
from engine.cpus import available_cpus
from engine.recognizer import Recognizer

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from engine.whisper.recognizer import WhisperRecognizer, WhisperRecognizerConfig


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Which model to load and how to run it. No defaults: the server's settings are the
    one source of them (`server.engine_plan.model_config`), for benches and tests too.

    `model` is a packaged name (`tiny.en`, `base`), a Hugging Face Whisper folder, or a
    hub id already in the local hub cache. Packaged models are converted once into
    `cache`. `device="auto"` picks cuda when present; `dtype="auto"` is float32 on the CPU
    and float16 on cuda; `encoder_dtype` the encoder's (`resolve_encoder_dtype`).
    `partial_quantize` the weights partials decode through (`resolve_partial_quantize`).
    `workers` model workers run batches at once (`worker_plan`; 0: one per CPU this
    process may use on the CPU (`engine.cpus`: affinity and cgroup quota), one on cuda),
    each with `torch_threads` threads (0: those CPUs shared out among the workers).
    """

    model: str
    cache: Path
    device: str  # "auto", "cpu", "cuda", "cuda:1"
    dtype: DTypeChoice
    encoder_dtype: DTypeChoice
    quantize: QuantizeChoice
    partial_quantize: PartialQuantizeChoice
    drafts: bool
    prompt_tokens: int  # previous text kept as each utterance's prompt; 0: none
    context_window: float  # longest window a left context may fill (seconds)
    context_own_window: bool  # a left context only fills the utterance's own window
    word_timings: bool
    decoder_graphs: bool  # CUDA graphs for decoder steps (`engine.whisper.step_graphs`)
    workers: int
    torch_threads: int


def resolve_device(config: ModelConfig) -> str:
    """The torch device: the configured one, or for `auto` cuda where torch sees a GPU."""
    if config.device != "auto":
        return config.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_quantize(config: ModelConfig, device: str) -> Quantize:
    """The int8 scope: the configured one, or for `auto` on the CPU in float32 the int8
    shortlist of the vocabulary projection (float32's tokens from faster decoder steps:
    docs/performance.md#the-models-arithmetic), nothing elsewhere."""
    if config.quantize != "auto":
        return config.quantize
    from engine.whisper.int8 import int8_available

    cpu_float32 = device == "cpu" and config.dtype in ("auto", "float32")
    return "int8-shortlist" if cpu_float32 and int8_available() else "none"


def resolve_partial_quantize(config: ModelConfig, device: str) -> Literal["int8-decoder"] | None:
    """The int8 scope partials decode with (None: the finals'): the configured one, or for
    `auto` `int8-decoder` where finals use `int8-shortlist` (cheaper partials: a step reads
    a quarter of the layers' bytes: docs/performance.md#the-models-arithmetic)."""
    if config.partial_quantize == "same":
        return None
    if config.partial_quantize == "int8-decoder":
        return "int8-decoder"
    return "int8-decoder" if resolve_quantize(config, device) == "int8-shortlist" else None


def resolve_encoder_dtype(config: ModelConfig, device: str) -> DType | None:
    """The encoder's dtype (None: the model's): the configured one, or for `auto` bfloat16
    on a CPU that multiplies bfloat16 natively, where it runs a float32 model's encoder
    faster at the same WER (docs/performance.md#the-models-arithmetic), the model's
    elsewhere and under `int8` (which quantizes the encoder)."""
    if config.encoder_dtype != "auto":
        return config.encoder_dtype
    cpu_float32 = device == "cpu" and config.dtype in ("auto", "float32")
    if cpu_float32 and resolve_quantize(config, device) != "int8" and native_bfloat16():
        return "bfloat16"
    return None


def native_bfloat16() -> bool:
    """Whether this CPU has bfloat16 dot products (AVX-512 BF16 or AMX): without them
    torch emulates bfloat16 matrix products, slower than float32. Linux only (it reads
    /proc/cpuinfo's flags); False elsewhere."""
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return bool({"avx512_bf16", "amx_bf16"} & set(flags))


def worker_plan(config: ModelConfig) -> tuple[int, int]:
    """(model workers, torch threads for each). On the CPU one worker per CPU this process
    may use (`engine.cpus`: affinity and cgroup quota, not the host's count) with one
    thread each: a decoder step is ~150 small operations that a second thread hardly
    speeds up, while a second worker runs a second batch
    (docs/performance.md#workers-and-batches). On cuda
    one worker: the GPU batches rows; more workers would only contend for it."""
    cores = available_cpus()
    workers = config.workers or (cores if resolve_device(config) == "cpu" else 1)
    return workers, config.torch_threads or max(1, cores // workers)


def set_torch_threads(threads: int) -> None:
    """This thread's torch thread count (OpenMP's is per OS thread): each model worker
    calls it once when it starts."""
    import torch

    torch.set_num_threads(threads)


def load_whisper(config: ModelConfig) -> Recognizer:
    """The default recognizer: Whisper through torch + transformers."""
    import torch

    # silero_vad's import (if anything imports it) sets 1 thread process-wide: set ours last.
    # This is the loading thread's count; each model worker sets its own (`worker_plan`).
    torch.set_num_threads(config.torch_threads or available_cpus())
    whisper = whisper_config(config)
    if config.decoder_graphs and not whisper.decoder_graphs:
        logger.warning(
            "PARLEY_DECODER_GRAPHS: no GPU (%s), decoder steps run eagerly", whisper.device
        )
    return load_recognizer(config.model, whisper, cache=config.cache)


def whisper_config(config: ModelConfig) -> WhisperRecognizerConfig:
    """The recognizer's config for `config`, its choices resolved for this machine: what
    `load_whisper` loads, and what a bench that varies one of its fields starts from."""
    from engine.whisper.recognizer import WhisperRecognizerConfig

    device = resolve_device(config)
    return WhisperRecognizerConfig(
        device=device,
        dtype=None if config.dtype == "auto" else config.dtype,
        encoder_dtype=resolve_encoder_dtype(config, device),
        quantize=resolve_quantize(config, device),
        partial_quantize=resolve_partial_quantize(config, device),
        drafts=config.drafts,
        prompt_tokens=config.prompt_tokens,
        context_window=config.context_window,
        context_own_window=config.context_own_window,
        word_timings=config.word_timings,
        decoder_graphs=config.decoder_graphs and device.startswith("cuda"),
    )


def load_recognizer(
    spec: str, config: WhisperRecognizerConfig | None = None, *, cache: Path
) -> WhisperRecognizer:
    """`resolve_model(spec, cache)` (converting a packaged model once), as a recognizer."""
    from engine.whisper.recognizer import WhisperRecognizer
    from engine.whisper.weights import resolve_model

    return WhisperRecognizer(resolve_model(spec, cache), config, name=spec)
