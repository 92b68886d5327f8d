"""What one decoder step and one encoder pass cost, by int8 scope, and whether a row's
result depends on its batch.

Five parts, one model load per `--quantize` scope (engine/whisper/recognizer.py `Quantize`):

- **projection**: the vocabulary projection alone (tiny.en's 51,864 × 384) through each
  kernel there is: float32, fbgemm int8 with one activation scale per call (the kernel
  as is), int8 with scales per row (`engine.whisper.int8.Int8Linear`), fbgemm's float16 weights,
  `aten._weight_int8pack_mm` (int8 weights, bfloat16 activations), and the int8 shortlist
  rescored in float32 (`engine.whisper.vocabulary.ShortlistHead`, to its greedy choice, which is
  all a step needs), on decoder states of real speech. "same alone" says whether row 0's
  output is bit for bit the same alone and in a batch of 8.
- **step**: one decoder step (one new token per row, 24 tokens cached, the projection
  and the greedy choice of each row's token included) at each batch size, per scope.
- **encoder**: one encoder pass of one row, per window, per scope.
- **rows**: eight corpus clips decoded together and each alone (the same encoder states):
  how many rows' tokens, and start-step logits, are identical.
- **partials** (not by default): live partials' audio (each clip's first 0.8-6.4 s, the
  previous prefix's text as the draft) decoded as a final is (today's partials before
  `Utterance.partial`) and as a partial under each `--partial-grids` setting (extra
  windows / margin / token budget per second): partials given empty text (loops), words
  that differ from the final-like text, mean window and time per partial (last
  `--quantize` scope only; a model of its own, with the default final windows).

Medians over `--repeats` timed calls after a warm-up, on `--threads` torch threads (1: what
each of the two model workers gets on the 2-core machine).

    python -m bench.step
    python -m bench.step --quantize none int8-decoder --batch-sizes 1 8
    python -m bench.step --quantize int8-shortlist --parts partials \
        --partial-grids none/1/8 4,6,8/2/8 4,6,8/2/5
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import torch
from torch.nn import functional

from bench.corpus import clips
from engine.api import Utterance
from engine.choices import QUANTIZE_SCOPES
from engine.loading import load_recognizer
from engine.whisper.greedy import GreedyDecoder
from engine.whisper.int8 import Int8Linear
from engine.whisper.recognizer import Quantize, WhisperRecognizer, WhisperRecognizerConfig
from engine.whisper.vocabulary import Choice, ShortlistHead
from loadgen.wer import ErrorCounts, error_counts
from server.settings import ModelSettings

logger = logging.getLogger("bench.step")

SCOPES: tuple[Quantize, ...] = QUANTIZE_SCOPES
ROW_CLIPS = ("en_ls_", "en_jfk", "en_lj_LJ0")
CACHED = 24  # tokens already in the cache when a step is timed
PARTIAL_PREFIXES = (0.8, 1.6, 2.4, 3.2, 4.0, 4.8, 5.6, 6.4)  # seconds: a live utterance's partials


@dataclass(frozen=True, slots=True)
class Settings:
    model: str
    model_cache: Path
    threads: int
    quantize: tuple[Quantize, ...]
    batch_sizes: tuple[int, ...]
    windows: tuple[float, ...]
    repeats: int
    parts: tuple[str, ...]
    partial_grids: tuple[PartialGrid, ...] = ()


def parse_args(argv: Sequence[str] | None) -> Settings:
    parser = argparse.ArgumentParser(prog="python -m bench.step", description=__doc__)
    parser.add_argument("--model", default=ModelSettings().model)
    parser.add_argument(
        "--model-cache",
        type=Path,
        default=Path(os.environ.get("PARLEY_MODEL_CACHE") or Path(ModelSettings().model_cache)),
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    parser.add_argument("--quantize", nargs="+", choices=SCOPES, default=list(SCOPES))
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--windows", type=float, nargs="+", default=[5.0, 10.0, 30.0])
    parser.add_argument("--repeats", type=int, default=15, help="timed calls per cell")
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=["projection", "step", "encoder", "rows", "partials"],
        default=["projection", "step", "encoder", "rows"],
    )
    parser.add_argument(
        "--partial-grids",
        nargs="+",
        default=["none/1/8", "4,6,8/2/8", "4,6,8/2/5"],
        help="partials part: WINDOWS/MARGIN/TOKENS_PER_S settings to compare "
        "(WINDOWS: extra windows, comma separated, or none)",
    )
    args = parser.parse_args(argv)
    return Settings(
        model=args.model,
        model_cache=args.model_cache,
        threads=args.threads,
        quantize=tuple(args.quantize),
        batch_sizes=tuple(args.batch_sizes),
        windows=tuple(sorted(set(args.windows))),
        repeats=args.repeats,
        parts=tuple(args.parts),
        partial_grids=tuple(PartialGrid.parse(g) for g in args.partial_grids),
    )


def timed(call: Callable[[], object], repeats: int) -> float:
    """Median milliseconds of `repeats` calls, after one untimed call."""
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def projection_kernels(
    linear: torch.nn.Linear,
) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """Every way to run the vocabulary projection (no bias) on float32 rows."""
    weight = linear.weight.detach()
    scales = weight.abs().amax(dim=1).clamp(min=1e-8) / 127.0
    int8_weight = torch.round(weight / scales[:, None]).to(torch.int8)
    bf16_scales = scales.to(torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quantized = torch.quantize_per_channel(
            weight, scales.double(), torch.zeros(weight.shape[0], dtype=torch.long), 0, torch.qint8
        )
        per_call = torch.ops.quantized.linear_prepack(quantized, None)
        fp16 = torch.ops.quantized.linear_prepack_fp16(weight, None)
    per_row = Int8Linear(linear)
    shortlist = ShortlistHead(linear)
    nothing = torch.zeros(0, dtype=torch.long)
    return {
        "float32": lambda x: functional.linear(x, weight),
        "int8, scale per call": lambda x: torch.ops.quantized.linear_dynamic(x, per_call, True),
        "int8, scales per row": per_row,
        "float16 weights (fbgemm)": lambda x: torch.ops.quantized.linear_dynamic_fp16(x, fp16),
        "int8 weights, bf16 rows": lambda x: torch.ops.aten._weight_int8pack_mm(
            x.to(torch.bfloat16), int8_weight, bf16_scales
        ).float(),
        # Not logits but the greedy choice (token, log-probability): what a step needs.
        "int8 shortlist, float32 rescoring (choice)": lambda x: (
            shortlist.choose(x, nothing).logprobs
        ),
    }


def decoder_rows(recognizer: WhisperRecognizer, hidden: torch.Tensor, count: int) -> torch.Tensor:
    """`count` decoder states of real speech, before the final layer norm: greedy decoding
    of `hidden`'s rows from the second generated token on (a text's first token, often a
    near tie among many, is the choice the shortlist rescues most: the rows part counts
    every choice), in the order decoded."""
    greedy = recognizer.whisper.greedy
    seen: list[torch.Tensor] = []
    choose = greedy.step.choose

    def capture(states: torch.Tensor, suppress: torch.Tensor) -> object:
        if suppress is greedy._suppress:  # not the first position's suppression
            seen.append(states)
        return choose(states, suppress)

    greedy.step.choose = capture  # type: ignore[method-assign,assignment]
    try:
        batch = hidden.shape[0]
        prompts = torch.tensor([recognizer.whisper.prompt_tail] * batch)
        greedy.decode(greedy.start(hidden), prompts, [40] * batch)
    finally:
        del greedy.step.choose
    rows = torch.cat(seen)
    if rows.shape[0] < count:
        raise RuntimeError(f"{rows.shape[0]} decoder states, {count} wanted")
    return rows[:count]


def projection_table(
    recognizer: WhisperRecognizer, hidden: torch.Tensor, settings: Settings
) -> list[str]:
    projection = recognizer.whisper.model.proj_out
    if not isinstance(projection, torch.nn.Linear):
        raise SystemExit("the projection table needs the float32 model (--quantize none first)")
    count = max(8, *settings.batch_sizes)
    rows = recognizer.whisper.model.model.decoder.layer_norm(
        decoder_rows(recognizer, hidden, count)
    )
    lines = [
        "| kernel | " + " | ".join(f"batch {b}" for b in settings.batch_sizes) + " | same alone |",
        "|---|" + "---|" * (len(settings.batch_sizes) + 1),
    ]
    for name, kernel in projection_kernels(projection).items():
        cells = [
            f"{timed(partial(kernel, rows[:b]), settings.repeats):.2f} ms"
            for b in settings.batch_sizes
        ]
        same = torch.equal(kernel(rows[:1]), kernel(rows[:8])[:1])
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {'yes' if same else 'no'} |")
    return lines


def encoder_states(recognizer: WhisperRecognizer, utterances: Sequence[Utterance]) -> torch.Tensor:
    """Each utterance encoded alone on the 30 s window, stacked."""
    window = recognizer.windows[-1]
    return torch.cat(
        [
            recognizer.whisper.encoders.encode(window, recognizer.preprocess([u], window))
            for u in utterances
        ]
    )


def step_cells(
    recognizer: WhisperRecognizer, hidden: torch.Tensor, settings: Settings
) -> list[str]:
    """One decoder step per batch size: the layers over a synthetic cache (their cost does
    not depend on the values), then the choice of each row's token on decoder states of
    real speech (the shortlist's does: a state it cannot vouch for is projected in full)."""
    greedy = recognizer.whisper.greedy
    real = decoder_rows(recognizer, hidden, max(settings.batch_sizes))
    cells = []
    for size in settings.batch_sizes:
        batch = hidden[torch.arange(size) % hidden.shape[0]]
        cache = greedy.start(batch, CACHED + 2).take_cache()
        ids = torch.full((size, 1), 440, dtype=torch.long)

        def step(cache: object = cache, ids: torch.Tensor = ids, size: int = size) -> object:
            cache.lengths[:] = CACHED  # type: ignore[attr-defined]
            greedy.step.feed(cache, ids)  # type: ignore[arg-type]
            return greedy.step.choose(real[:size], greedy._suppress)

        cells.append(f"{timed(step, settings.repeats):.2f} ms")
    return cells


def encoder_cells(recognizer: WhisperRecognizer, settings: Settings) -> list[str]:
    audio = Utterance(clips(("en_jfk",))[0].audio()[: 16_000 * 4])
    encode = recognizer.whisper.encoders.encode
    repeats = max(3, settings.repeats // 3)
    cells = []
    for window in settings.windows:
        features = recognizer.preprocess([audio], window)
        ms = timed(partial(encode, window, features), repeats)
        cells.append(f"{ms:.1f} ms")
    return cells


def rows_cell(recognizer: WhisperRecognizer, hidden: torch.Tensor) -> str:
    """Tokens and start logits of each row decoded alone against in the batch of all, and
    how many choices the int8 shortlist could not vouch for (projected again in full)."""
    greedy = recognizer.whisper.greedy
    prompt = recognizer.whisper.prompt_tail
    choices = [0, 0]
    choose = greedy.step.choose

    def counted(
        states: torch.Tensor, suppress: torch.Tensor, bias: torch.Tensor | None = None
    ) -> Choice:
        choice = choose(states, suppress, bias)
        choices[0] += choice.rescued.numel()
        choices[1] += int(choice.rescued.sum())
        return choice

    greedy.step.choose = counted  # type: ignore[method-assign]
    try:
        return rows_compared(greedy, prompt, hidden) + (
            f"; {choices[1]} of {choices[0]} choices rescued in full"
        )
    finally:
        del greedy.step.choose


def rows_compared(greedy: GreedyDecoder, prompt: list[int], hidden: torch.Tensor) -> str:
    together_start = greedy.start(hidden)
    together_logits = together_start.logits.clone()
    together = greedy.decode(
        together_start, torch.tensor([prompt] * hidden.shape[0]), [100] * hidden.shape[0]
    )
    same_tokens = same_logits = 0
    for i in range(hidden.shape[0]):
        started = greedy.start(hidden[i : i + 1])
        same_logits += torch.equal(started.logits[0], together_logits[i])
        alone = greedy.decode(started, torch.tensor([prompt]), [100])
        width = alone.tokens.shape[1]
        same_tokens += alone.tokens[0].tolist() == together.tokens[i, :width].tolist()
    n = hidden.shape[0]
    return f"{same_tokens}/{n} tokens, {same_logits}/{n} start logits"


@dataclass(frozen=True, slots=True)
class PartialGrid:
    """How partials are decoded: extra windows, the margin, the token budget's rate."""

    windows: tuple[float, ...]
    margin: float
    tokens_per_second: float

    @classmethod
    def parse(cls, text: str) -> PartialGrid:
        """`WINDOWS/MARGIN/RATE`, e.g. `4,6,8/2/5` (`none` for no extra windows)."""
        windows, margin, rate = text.split("/")
        extra = () if windows == "none" else tuple(float(w) for w in windows.split(","))
        return cls(extra, float(margin), float(rate))

    def __str__(self) -> str:
        windows = ",".join(f"{w:g}" for w in self.windows) or "none"
        return f"{windows}/{self.margin:g}/{self.tokens_per_second:g}"


def partial_windows(scope: Quantize, settings: Settings) -> list[str]:
    """Live partials' audio (every English clip's first 0.8, 1.6, ... s, each decoded
    alone as a live session sends it, with the previous prefix's text as its draft), as
    a final is decoded (today's partials before "Cheaper partials": no `partial` flag) and
    as a partial under each `--partial-grids` setting: the partials given empty text (a
    loop, or no speech), the words that differ from the final-like decoding's text, the
    mean window and the time per partial (features, encoder, decoder)."""
    prefixes = [
        [
            clip.audio()[: round(seconds * 16_000)]
            for seconds in PARTIAL_PREFIXES
            if seconds < clip.duration
        ]
        for clip in clips()
        if clip.language == "en" and clip.duration < 30
    ]
    count = sum(map(len, prefixes))
    extra = tuple(sorted({w for grid in settings.partial_grids for w in grid.windows}))
    base = WhisperRecognizerConfig(quantize=scope, partial_windows=extra)
    recognizer = load_recognizer(settings.model, base, cache=settings.model_cache)
    lines = [
        f"Partials: {count} prefixes of the English clips ("
        + ", ".join(f"{s:g}" for s in PARTIAL_PREFIXES)
        + " s), each decoded alone with the previous prefix's text as its draft:",
        "",
        "| decoded as | windows / margin / tokens per s | empty | words that differ from "
        "the final-like decoding's | mean window | per partial |",
        "|---|---|---|---|---|---|",
    ]
    reference: list[str] = []
    for grid in (None, *settings.partial_grids):
        if grid is not None:
            recognizer.config = replace(
                base,
                partial_windows=grid.windows,
                partial_margin=grid.margin,
                partial_tokens_per_second=grid.tokens_per_second,
            )
        texts: list[str] = []
        windows: list[float] = []
        elapsed = 0.0
        for audios in prefixes:
            draft = ""
            for audio in audios:
                utterance = Utterance(audio, draft=draft, partial=grid is not None)
                windows.append(recognizer.window([utterance]))
                start = time.perf_counter()
                text = recognizer.transcribe([utterance])[0].text
                elapsed += time.perf_counter() - start
                texts.append(text)
                draft = text or draft
        if grid is None:
            reference = texts
        errors = ErrorCounts(0, 0, 0, 0)
        for want, got in zip(reference, texts, strict=True):
            errors += error_counts(want, got)
        empty = sum(not t for t in texts)
        lines.append(
            f"| {'final' if grid is None else 'partial'} | {grid or '(final: 10 s+, 1 s, 8)'} "
            f"| {empty} | {errors.rate:.3f} ({errors.errors} of {errors.reference_length}) "
            f"| {statistics.mean(windows):.1f} s | {elapsed / count * 1000:.0f} ms |"
        )
    return lines


def run(settings: Settings) -> str:
    torch.set_num_threads(settings.threads)
    lines = [
        f"{settings.model}, {settings.threads} torch thread(s), torch {torch.__version__}, "
        f"median of {settings.repeats} calls",
        "",
    ]
    utterances = [Utterance(clip.audio()[: 16_000 * 28]) for clip in clips(ROW_CLIPS)[:8]]
    step_rows, encoder_rows, row_rows = [], [], []
    partial_lines: list[str] = []
    for scope in settings.quantize:
        windows = tuple(sorted({*settings.windows, 30.0}))
        config = WhisperRecognizerConfig(quantize=scope, windows=windows)
        recognizer = load_recognizer(settings.model, config, cache=settings.model_cache)
        with torch.inference_mode():
            hidden = encoder_states(recognizer, utterances)
            if scope == settings.quantize[0] and "projection" in settings.parts:
                table = projection_table(recognizer, hidden, settings)
                lines += ["Vocabulary projection (decoder states of real speech):", "", *table, ""]
            if "step" in settings.parts:
                step_rows.append(
                    f"| {scope} | " + " | ".join(step_cells(recognizer, hidden, settings)) + " |"
                )
            if "encoder" in settings.parts:
                encoder_rows.append(
                    f"| {scope} | " + " | ".join(encoder_cells(recognizer, settings)) + " |"
                )
            if "partials" in settings.parts and scope == settings.quantize[-1]:
                partial_lines = partial_windows(scope, settings)
            if "rows" in settings.parts:
                row_rows.append(f"| {scope} | {rows_cell(recognizer, hidden)} |")
        logger.info("%s done", scope)
    if step_rows:
        lines += [
            f"Decoder step (one token per row, {CACHED} cached, projection and choice included):",
            "",
            "| quantize | " + " | ".join(f"batch {b}" for b in settings.batch_sizes) + " |",
            "|---|" + "---|" * len(settings.batch_sizes),
            *step_rows,
            "",
        ]
    if encoder_rows:
        lines += [
            "Encoder pass, one row:",
            "",
            "| quantize | " + " | ".join(f"{w:g} s window" for w in settings.windows) + " |",
            "|---|" + "---|" * len(settings.windows),
            *encoder_rows,
            "",
        ]
    if row_rows:
        lines += [
            f"Rows decoded alone vs in a batch of {len(utterances)} (same encoder states):",
            "",
            "| quantize | identical |",
            "|---|---|",
            *row_rows,
        ]
    if partial_lines:
        lines += ["", *partial_lines]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    settings = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    print(run(settings))


if __name__ == "__main__":
    main()
