"""`python -m bench.ttfs --client pipecat`: each clip through pipecat's own client, as
pipecat's stt-benchmark runs a sample (github.com/pipecat-ai/stt-benchmark,
src/stt_benchmark/pipeline/benchmark_runner.py): a pipecat pipeline of its Silero VAD
(`VADParams` with the bench's `stop_secs`, 0.2 as the benchmark sets it) and its
`DeepgramSTTService` (its `base_url` at the bench's server, its settings the benchmark's,
src/stt_benchmark/services.py: nova-3-general, English, no smart format or profanity
filter; interim results and punctuation, pipecat's defaults), with metrics on, then a
collector. The clip, then `--tail` seconds of silence, is queued as 20 ms
`InputAudioRawFrame`s at real time; silence follows, as the benchmark's transport sends
it, until the measurement is done. A new pipeline (and connection) per clip.

TTFS is the benchmark's own figure: pipecat's STT "TTFB" metric, which the benchmark
collects from the service's `MetricsFrame`s (src/stt_benchmark/observers/
metrics_collector.py: `TTFBMetricsData` pushed by the STT service, zeros skipped, the
last one of a sample kept). pipecat computes it in `STTService`
(pipecat/services/stt_service.py): it starts at the `VADUserStoppedSpeakingFrame`'s
`timestamp` (wall clock, when the VAD emitted it) minus its `stop_secs`, and stops at the
receipt of the first `TranscriptionFrame` marked finalized (the final the server sent for
the `Finalize` the service sent at that VAD stop, `from_finalize`), at an empty
`from_finalize` answer's receipt (the transcript had already come), or else, 2 s
(`stt_ttfb_timeout`) after the stop, at the last `TranscriptionFrame`'s. So a Finalize
answered more than 2 s after the stop is not measured: the figure is then the last
transcript's before the timeout (refused where it predates the speech end), or none (the
clip is not answered); beside rooms, finals have taken longer. The last final frame's
receipt minus the same speech end is the check (`last_final_minus_speech_end`, printed
where it differs by over 10 ms).
"""

from __future__ import annotations

import asyncio
import sys
import time
import warnings
from typing import Any

from loguru import logger

from bench.ttfs import FRAME, RATE, ClipRun, VadParams
from loadgen.audio import load_audio
from loadgen.corpus import Clip

logger.remove()  # pipecat logs each frame's processing at DEBUG, its banner at INFO
logger.add(sys.stderr, level="WARNING")

with warnings.catch_warnings():
    # as in tests/e2e/test_pipecat_e2e.py: deepgram-sdk warns on `websockets.legacy`,
    # pipecat.audio.utils imports `audioop`
    warnings.filterwarnings("ignore", r"websockets\..* is deprecated", DeprecationWarning)
    warnings.filterwarnings("ignore", r"'audioop' is deprecated", DeprecationWarning)
    from pipecat.audio.vad.silero import SileroVADAnalyzer
    from pipecat.audio.vad.vad_analyzer import VADParams
    from pipecat.frames.frames import (
        EndFrame,
        Frame,
        InputAudioRawFrame,
        MetricsFrame,
        TranscriptionFrame,
        VADUserStartedSpeakingFrame,
        VADUserStoppedSpeakingFrame,
    )
    from pipecat.metrics.metrics import TTFBMetricsData
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.processors.audio.vad_processor import VADProcessor
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
    from pipecat.services.deepgram.stt import DeepgramSTTService
    from pipecat.transcriptions.language import Language
    from pipecat.workers.runner import WorkerRunner

API_KEY = "unused"  # a server without API keys takes any key (docs/compat.md: Credentials)
# The benchmark's waits (src/stt_benchmark/pipeline/benchmark_runner.py): for a TTFB after
# the transcript, 2.5 s (pipecat reports one, or none, within its 2 s stt_ttfb_timeout of a
# stop); for transcripts, silence sent for at most 10 s after the audio
TTFB_WAIT = 2.5
MAX_WAIT = 10.0


class Collector(FrameProcessor):
    """Keeps every downstream frame but audio that reaches it, with its receipt time (wall
    clock, as pipecat's frame timestamps and metrics), and passes it on."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[tuple[float, Frame]] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction == FrameDirection.DOWNSTREAM and not isinstance(frame, InputAudioRawFrame):
            self.frames.append((time.time(), frame))
        await self.push_frame(frame, direction)


class RecordingSTT(DeepgramSTTService):
    """pipecat's DeepgramSTTService, keeping (as tests/e2e/test_pipecat_e2e.py's) what the
    server sent: each final Results' receipt, transcript and `from_finalize` (the empty
    ones it pushes no frame for included), when it sent each `Finalize`, and its errors."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.finals: list[tuple[float, str, bool]] = []
        self.flushes: list[float] = []
        self.errors: list[str] = []

    async def _on_message(self, message: Any) -> None:
        if getattr(message, "type", None) == "Results" and getattr(message, "is_final", False):
            text = message.channel.alternatives[0].transcript
            flushed = bool(getattr(message, "from_finalize", False))
            self.finals.append((time.time(), text, flushed))
        await super()._on_message(message)  # type: ignore[no-untyped-call]

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        connected = self._connection is not None
        await super().process_frame(frame, direction)  # sends Finalize at a VAD stop
        if isinstance(frame, VADUserStoppedSpeakingFrame) and connected:
            self.flushes.append(time.time())

    async def push_error(self, error_msg: str, *args: Any, **kwargs: Any) -> None:
        self.errors.append(error_msg)
        await super().push_error(error_msg, *args, **kwargs)


def ttfb(frame: Frame, stt: RecordingSTT) -> list[float]:
    """The TTFB values in a frame that the service pushed, as the benchmark's
    MetricsCollectorObserver keeps them (pipecat's initialization zeros skipped)."""
    if not isinstance(frame, MetricsFrame):
        return []
    return [
        data.value
        for data in frame.data
        if isinstance(data, TTFBMetricsData) and data.processor == stt.name and data.value
    ]


def measured(stt: RecordingSTT, collector: Collector) -> bool:
    """Each Finalize has had its `from_finalize` answer (for the check), and the last VAD
    stop's TTFB came after it (no speech since; one is started only at a stop) or
    `TTFB_WAIT` has passed since that stop without one."""
    vad = (VADUserStartedSpeakingFrame, VADUserStoppedSpeakingFrame)
    marks = [frame for _, frame in collector.frames if isinstance(frame, vad) or ttfb(frame, stt)]
    last = marks[-1] if marks else None
    answers = sum(1 for _, _, flushed in stt.finals if flushed)
    if answers < len(stt.flushes):
        return False
    if isinstance(last, VADUserStoppedSpeakingFrame):
        return time.time() - last.timestamp > TTFB_WAIT
    return isinstance(last, MetricsFrame)


async def run_clip(url: str, clip: Clip, params: VadParams, tail: float) -> ClipRun:
    """Stream one clip at real time through pipecat's VAD and DeepgramSTTService; its TTFS
    (the benchmark's) and text."""
    pcm = load_audio(clip.path).tobytes() + bytes(2 * round(tail * RATE))
    vad = SileroVADAnalyzer(
        params=VADParams(
            confidence=params.confidence, start_secs=params.start_secs, stop_secs=params.stop_secs
        )
    )
    settings = DeepgramSTTService.Settings(
        model="nova-3-general", smart_format=False, profanity_filter=False, language=Language.EN
    )
    stt = RecordingSTT(api_key=API_KEY, base_url=url, settings=settings)
    collector = Collector()
    worker = PipelineWorker(
        Pipeline([VADProcessor(vad_analyzer=vad), stt, collector]),
        params=PipelineParams(audio_in_sample_rate=RATE, enable_metrics=True),
        cancel_on_idle_timeout=False,
        idle_timeout_secs=None,
    )
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")  # type: ignore[untyped-decorator]
    async def on_started(worker: PipelineWorker, frame: Frame) -> None:
        started.set()

    async def feed() -> None:
        await asyncio.wait_for(started.wait(), 30)
        try:
            step, sent, begun = 2 * FRAME, 0, time.monotonic()
            while sent < len(pcm) or (
                not measured(stt, collector)
                and time.monotonic() - begun < len(pcm) / (2 * RATE) + MAX_WAIT
            ):
                chunk = pcm[sent : sent + step] if sent < len(pcm) else bytes(step)
                frame = InputAudioRawFrame(audio=chunk, sample_rate=RATE, num_channels=1)
                await worker.queue_frame(frame)
                sent += step
                await asyncio.sleep(max(0.0, begun + sent / (2 * RATE) - time.monotonic()))
        finally:
            await worker.queue_frame(EndFrame())

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    async with asyncio.timeout(len(pcm) / (2 * RATE) + MAX_WAIT + 60):
        await asyncio.gather(runner.run(), feed())

    run = ClipRun(
        clip.id, finals=stt.finals, flushes=stt.flushes, error="; ".join(dict.fromkeys(stt.errors))
    )
    finals = [(at, f.text) for at, f in collector.frames if isinstance(f, TranscriptionFrame)]
    run.text = " ".join(text for _, text in finals)
    values = [value for _, frame in collector.frames for value in ttfb(frame, stt)]
    run.ttfs = values[-1] if values else None  # the benchmark keeps a sample's last
    segments = [final for final in stt.finals if final[1].strip()]
    stops = [f for _, f in collector.frames if isinstance(f, VADUserStoppedSpeakingFrame)]
    if segments and run.flushes:
        run.answer = segments[-1][0] - run.flushes[-1]
        run.by_flush = segments[-1][2]
    if finals and stops:  # the check: the same speech end, to the last final frame
        run.last_final = finals[-1][0] - (stops[-1].timestamp - stops[-1].stop_secs)
    return run
