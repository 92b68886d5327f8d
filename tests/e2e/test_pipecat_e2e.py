"""End to end through pipecat's own Deepgram STT services: a real server (real model, the
turn model on), real speech, pipecat-ai 1.14.0's services in a pipecat pipeline.

`DeepgramSTTService` on `/v1/listen` behind pipecat's Silero VAD (its `Finalize` comes
from the VAD's `VADUserStoppedSpeakingFrame`, as in a voice agent), and
`DeepgramFluxSTTService` on `/v2/listen` (its turns come from the server) before
pipecat's user context aggregator: what the services push down the pipeline (interim
then final transcription frames; for Flux the turn's start and end proposals around its
transcript) and, for Flux, the user turn the aggregator makes of them. The pipelines have
no transport: the test queues 20 ms InputAudioRawFrames in real time, as one would."""

from __future__ import annotations

import asyncio
import time
import warnings
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest

from loadgen.wer import error_rate
from tests.support.compat_clients import WEBSOCKETS_LEGACY
from tests.support.corpus import clip
from tests.support.servers import ServerProcess, start_server
from tests.support.timeouts import S

with warnings.catch_warnings():
    # deepgram-sdk (imported by pipecat's service) warns on `websockets.legacy`, as in
    # tests/support/compat_clients.py; pipecat.audio.utils imports `audioop` (3.13 drops it)
    warnings.filterwarnings("ignore", r"websockets\..* is deprecated", DeprecationWarning)
    warnings.filterwarnings("ignore", r"'audioop' is deprecated", DeprecationWarning)
    from pipecat.audio.vad.silero import SileroVADAnalyzer
    from pipecat.frames.frames import (
        EndFrame,
        Frame,
        InputAudioRawFrame,
        InterimTranscriptionFrame,
        LLMContextFrame,
        ProposedUserStartedSpeakingFrame,
        ProposedUserStoppedSpeakingFrame,
        TranscriptionFrame,
        UserStartedSpeakingFrame,
        UserStoppedSpeakingFrame,
        VADUserStartedSpeakingFrame,
        VADUserStoppedSpeakingFrame,
    )
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
    from pipecat.processors.audio.vad_processor import VADProcessor
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
    from pipecat.services.deepgram.flux.stt import DeepgramFluxSTTService
    from pipecat.services.deepgram.stt import DeepgramSTTService
    from pipecat.workers.runner import WorkerRunner

pytestmark = [pytest.mark.slow, WEBSOCKETS_LEGACY]

RATE = 16_000
FRAME_S = 0.02  # what a pipecat transport pushes: 20 ms of audio per frame
TIMEOUT = 60 * S
API_KEY = "unused"  # a server without API keys takes any key (docs/compat.md: Credentials)

F = TypeVar("F", bound=Frame)


@pytest.fixture(scope="module")
def turn_server() -> Iterator[ServerProcess]:
    """A server with the turn model, as tests/e2e/test_turns_e2e.py's: Flux needs it, and
    `/v1/listen` streams on it as on any server."""
    server = start_server({"PARLEY_TURN_MODEL": "true"})
    yield server
    server.stop()


@dataclass
class Collected:
    """The frames a Collector passed downstream, in order."""

    frames: list[Frame] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    def of(self, kind: type[F]) -> list[F]:
        # InterimTranscriptionFrame is no TranscriptionFrame (both are TextFrames)
        return [f for f in self.frames if isinstance(f, kind)]

    def names(self, *kinds: type[Frame]) -> list[str]:
        """The class names of the frames of these kinds, in order."""
        return [type(f).__name__ for f in self.frames if isinstance(f, kinds)]

    async def wait_for(self, predicate: Callable[[Collected], bool], timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while not predicate(self):
                self.arrived.clear()
                await self.arrived.wait()


class Collector(FrameProcessor):
    """Keeps every downstream frame that passes it (and passes it on)."""

    def __init__(self, into: Collected) -> None:
        super().__init__()
        self.into = into

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction == FrameDirection.DOWNSTREAM:
            self.into.frames.append(frame)
            self.into.arrived.set()
        await self.push_frame(frame, direction)


async def run_pipeline(
    processors: list[FrameProcessor],
    feed: Callable[[PipelineWorker, Collected], Awaitable[None]],
) -> Collected:
    """Run `processors` and a Collector as a pipecat pipeline at 16 kHz until `feed` (which
    gets the worker once the pipeline has started, and what the Collector has) returns,
    then end it with an EndFrame (the services close their sockets)."""
    collected = Collected()
    worker = PipelineWorker(
        Pipeline([*processors, Collector(collected)]),
        params=PipelineParams(audio_in_sample_rate=RATE),
        cancel_on_idle_timeout=False,
        idle_timeout_secs=None,
    )
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")  # type: ignore[untyped-decorator]
    async def on_started(worker: PipelineWorker, frame: Frame) -> None:
        started.set()

    async def drive() -> None:
        await asyncio.wait_for(started.wait(), TIMEOUT)
        try:
            await feed(worker, collected)
        finally:
            await worker.queue_frame(EndFrame())

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    async with asyncio.timeout(2 * TIMEOUT):
        await asyncio.gather(runner.run(), drive())
    return collected


async def stream(worker: PipelineWorker, pcm: bytes) -> None:
    """Queue 16 kHz PCM16 as InputAudioRawFrames in real time, 20 ms a frame."""
    step = int(RATE * FRAME_S) * 2
    started = time.monotonic()
    for i, offset in enumerate(range(0, len(pcm), step)):
        chunk = InputAudioRawFrame(
            audio=pcm[offset : offset + step], sample_rate=RATE, num_channels=1
        )
        await worker.queue_frame(chunk)
        await asyncio.sleep(max(0.0, started + (i + 1) * FRAME_S - time.monotonic()))


def silence(seconds: float) -> bytes:
    return bytes(2 * int(RATE * seconds))


class RecordingDeepgramSTTService(DeepgramSTTService):
    """pipecat's DeepgramSTTService, keeping every message the server sent it (as the SDK
    parsed it), the empty Results it pushes no frame for included."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.received: list[Any] = []

    async def _on_message(self, message: Any) -> None:
        self.received.append(message)
        await super()._on_message(message)  # type: ignore[no-untyped-call]

    def finalize_answers(self) -> list[Any]:
        return [m for m in self.received if getattr(m, "from_finalize", False)]


async def test_deepgram_stt_service_behind_pipecats_vad(turn_server: ServerProcess) -> None:
    """JFK in real time through pipecat's Silero VAD and DeepgramSTTService (its default
    settings: nova-3-general, interim results, punctuation, a KeepAlive every 5 s): interim
    transcription frames come before the first final one, the finals' text is within WER
    0.15, each of the VAD's stops sends a `Finalize` and each gets its one answer
    (`from_finalize`: the final it closed, or an empty one when the server had already
    cut the utterance), and pipecat marks a final the server closed for a `Finalize` as
    finalized."""
    jfk = clip("en_jfk")
    stt = RecordingDeepgramSTTService(api_key=API_KEY, base_url=turn_server.ws_url)

    async def feed(worker: PipelineWorker, collected: Collected) -> None:
        await stream(worker, jfk.pcm16() + silence(1.0))
        await collected.wait_for(
            lambda c: len(stt.finalize_answers()) >= len(c.of(VADUserStoppedSpeakingFrame)),
            TIMEOUT,
        )

    vad = VADProcessor(vad_analyzer=SileroVADAnalyzer())
    collected = await run_pipeline([vad, stt], feed)

    frames = collected.frames
    finals = collected.of(TranscriptionFrame)
    interims = collected.of(InterimTranscriptionFrame)
    assert finals and interims
    assert frames.index(interims[0]) < frames.index(finals[0]), "no interim before the final"
    text = " ".join(f.text for f in finals)
    wer = error_rate(jfk.reference, text)
    stops = collected.of(VADUserStoppedSpeakingFrame)
    answers = stt.finalize_answers()
    print(
        f"pipecat DeepgramSTTService en_jfk: WER {wer:.3f}, {len(interims)} interim and "
        f"{len(finals)} final frames ({sum(f.finalized for f in finals)} finalized), "
        f"{len(stops)} VAD stops (Finalize), {len(answers)} from_finalize Results "
        f"({sum(not a.channel.alternatives[0].transcript for a in answers)} empty)"
    )
    assert wer <= 0.15, text
    assert collected.of(VADUserStartedSpeakingFrame) and stops
    assert len(answers) == len(stops)  # one answer per Finalize
    assert all(a.is_final for a in answers)
    assert all(f.result is not None and f.result.is_final for f in finals)  # final Results
    assert any(f.finalized for f in finals)
    assert "country" in finals[-1].text.lower()


async def test_flux_stt_service_turn(turn_server: ServerProcess) -> None:
    """A finished sentence through DeepgramFluxSTTService on `/v2/listen` (the turn model
    ends the turn), then pipecat's user context aggregator, as in a voice agent. The
    service proposes the turn's start (Flux StartOfTurn), pushes the turn's Updates as
    interim transcription frames, then at EndOfTurn one finalized TranscriptionFrame
    holding the sentence (within WER 0.3) and the proposal that the user stopped
    speaking, in that order; its `on_end_of_turn` handler gets the same text, and its
    result the turn's words with the confidences pipecat's `min_confidence` reads. The
    aggregator (its turn strategies the ones the service recommends) turns them into
    UserStartedSpeakingFrame, UserStoppedSpeakingFrame and the LLM context whose user
    message is that text."""
    sentence = clip("en_ls_1221-135766-0002")
    service_frames = Collected()
    ended: list[str] = []

    async def feed(worker: PipelineWorker, agent: Collected) -> None:
        await stream(worker, silence(0.3) + sentence.pcm16() + silence(1.5))
        await agent.wait_for(lambda c: bool(c.of(LLMContextFrame)), TIMEOUT)

    stt = DeepgramFluxSTTService(api_key=API_KEY, url=f"{turn_server.ws_url}/v2/listen")

    @stt.event_handler("on_end_of_turn")  # type: ignore[untyped-decorator]
    async def on_end_of_turn(service: DeepgramFluxSTTService, transcript: str) -> None:
        ended.append(transcript)

    context = LLMContext()
    user = LLMContextAggregatorPair(context).user()
    agent = await run_pipeline([stt, Collector(service_frames), user], feed)

    kinds = service_frames.names(
        ProposedUserStartedSpeakingFrame,
        InterimTranscriptionFrame,
        TranscriptionFrame,
        ProposedUserStoppedSpeakingFrame,
    )
    assert kinds[0] == "ProposedUserStartedSpeakingFrame", kinds
    assert kinds[-2:] == ["TranscriptionFrame", "ProposedUserStoppedSpeakingFrame"], kinds
    assert set(kinds[1:-2]) == {"InterimTranscriptionFrame"}, kinds
    [final] = service_frames.of(TranscriptionFrame)
    text = final.text
    wer = error_rate(sentence.reference, text)
    print(f"pipecat DeepgramFluxSTTService: WER {wer:.3f}, {len(kinds) - 3} interim frames")
    # tiny.en writes "Hester Prynne" as other words (3 of the 11: "has to print")
    assert wer <= 0.3 and "apprehension" in text.lower(), text
    assert final.finalized
    result = final.result
    assert result is not None
    assert result["event"] == "EndOfTurn" and result["turn_index"] == 0
    assert result["trigger"] == "model" and result["end_of_turn_confidence"] >= 0.5
    # The words whose confidences pipecat averages for its `min_confidence` filter
    words = result["words"]
    assert [w["word"] for w in words] == text.split(), words
    assert all(0 < w["confidence"] <= 1 for w in words)
    assert ended == [text]
    # What the agent's LLM gets: one user turn, started and stopped, with the turn's text.
    turn = agent.names(UserStartedSpeakingFrame, UserStoppedSpeakingFrame, LLMContextFrame)
    assert turn == ["UserStartedSpeakingFrame", "UserStoppedSpeakingFrame", "LLMContextFrame"]
    assert context.messages == [{"role": "user", "content": text}]
