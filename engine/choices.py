"""The engine's vocabularies of choices, as `Literal` aliases: one place for each, which
the recognizer, the loader and the server's settings all use (`typing.get_args` lists a
vocabulary's values). No torch here: the settings import it."""

from __future__ import annotations

from typing import Literal, get_args

# A model's floating-point type; `auto` (settings and `ModelConfig`): float32 on the CPU,
# float16 on CUDA.
DType = Literal["float32", "float16", "bfloat16"]
DTypeChoice = Literal["auto", "float32", "float16", "bfloat16"]
# What runs in int8 (`engine.whisper.int8`): nothing; the vocabulary projection's shortlist
# only, rescored in float32 (`engine.whisper.vocabulary`: float32's tokens); the decoder's
# linear layers (its vocabulary projection included); or every linear layer (the encoder's).
Quantize = Literal["none", "int8-shortlist", "int8-decoder", "int8"]
QuantizeChoice = Literal["auto", "none", "int8-shortlist", "int8-decoder", "int8"]
# The weights partials decode through: the finals' (`same`), or int8 decoder copies.
PartialQuantizeChoice = Literal["auto", "same", "int8-decoder"]
DeviceChoice = Literal["auto", "cpu", "cuda"]
# Where the model workers run (`engine.workers.processes.in_processes`).
ProcessMode = Literal["auto", "on", "off"]
# How a batch's model time grows with its rows (`engine.scheduling.config.SchedulerConfig`).
BatchCost = Literal["auto", "per-row", "flat"]

QUANTIZE_SCOPES: tuple[Quantize, ...] = get_args(Quantize)
INT8_SCOPES: tuple[Quantize, ...] = ("int8-shortlist", "int8-decoder", "int8")
