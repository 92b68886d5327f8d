"""End of turn by the model, on turns built at run time with espeak-ng: how often it
closes an unfinished turn early, and how often it makes a finished one wait.

Two sets, each of complete and incomplete turns:

- `tune`: bench/mixes.py's voices at espeak's default rate and pitch, speaking TUNE_*;
  the set one may look at while choosing TURN_SILENCE_MS and TURN_THRESHOLD;
- `heldout`: voices, rates (130-200 words a minute), pitches (25-75) and sentences the
  tuning set never uses (bench/meetings.py's HELDOUT_VOICES, HELDOUT_*): no setting was
  fitted to it.

Each sentence is spoken by three voices. A complete turn is one sentence (no pause
inside), then 1.5 s of silence. An incomplete one is one sentence spoken with a 0.5-0.8 s
pause inside it (an SSML `<break>`: the intonation before the pause is the sentence's,
not a sentence's end, as when a speaker stops to think), then 1.5 s of silence; the
pause is longer than MIN_SILENCE_MS, so the fixed rule closes the turn there. Each clip
runs through the live pipeline (Silero VAD, the segmenter, the turn model) in 20 ms
frames. Rates:

- early close: an incomplete turn whose first utterance ended inside its pause;
- late close: a complete turn that did not end within TURN_SILENCE_MS plus one window
  (it waited for the hold or the silence rule).

    python -m bench.turns [--set tune|heldout|both] [--threshold 0.5] [--off] [--words]
    python -m bench.turns --cost          # ms per decision, features and model, batches 1/4/8

(`--off`: the fixed silence rule alone, for comparison; `--words`: the turn model and
the words so far, as a live stream has them with TURN_WORDS (session/turn_words.py), decoded
here by the default model.)
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from bench.corpus import read_wav
from bench.meetings import HELDOUT_VOICES, Voice
from bench.mixes import VOICES
from engine.api import SAMPLE_RATE, Utterance
from engine.loading import load_whisper
from engine.recognizer import Recognizer
from server.engine_plan import model_config
from server.settings import Settings
from session.audio import FrameDecoder
from session.pipeline import AudioPipeline, TurnWords
from session.segmenter import SegmenterConfig, TurnCheck, UtteranceEnded
from session.turn import SmartTurn, TurnBatcher
from session.turn_words import ends_unfinished
from session.vad import WINDOW, DirectScorer, SileroVad
from wire.codes import Encoding

FloatArray = npt.NDArray[np.float32]

TUNE_COMPLETE = (
    "Who is taking the notes today?",
    "That sounds good to me.",
    "I will put it on the agenda for Wednesday.",
    "Did anyone hear back from the design team about the new icons?",
    "Let us wrap up for today.",
    "I think that settles it.",
)
TUNE_INCOMPLETE = (
    ("If the tests pass tonight then", "the release can go out on Thursday."),
    ("The customer asked for an export to", "spreadsheets last month."),
    ("We moved the database to the", "new cluster last week."),
    ("Let us start with the numbers from", "last week before the roadmap."),
    ("I can take the first one but", "not the second one."),
    ("Then we should decide by the end of", "the week so engineering can start."),
)
HELDOUT_COMPLETE = (
    "Can you send me the slides after the call?",
    "Thanks, that was really helpful.",
    "The budget was approved this morning.",
    "Where did we put the contract draft?",
    "I agree with Maria on this one.",
    "Let us meet again on Monday at ten.",
)
HELDOUT_INCOMPLETE = (
    ("I was thinking that we should", "move the meeting to Friday."),
    ("So the main reason we changed it is", "that the old one kept crashing."),
    ("My plan for tomorrow is to", "finish the report and send it out."),
    ("Could you ask the team to", "review the pull request today?"),
    ("Before we go on I want to", "thank everyone for the hard work."),
    ("The numbers look better than", "what we expected in January."),
)
VOICES_PER_SENTENCE = 3
SENTENCES = 6  # of each kind, in each set
FRAME = 320  # samples per frame (20 ms), as a browser sends them
TAIL = 1.5  # seconds of silence after each turn


@dataclass(frozen=True, slots=True)
class TurnClip:
    name: str
    audio: FloatArray
    complete: bool
    speech_end: int  # sample where the (first part's) speech ends
    resume: int  # incomplete: the sample where the rest of the sentence starts


def voices(which: str, count: int, rng: np.random.Generator) -> list[Voice]:
    if which == "tune":  # a sentence's repeats (SENTENCES apart) in three other voices
        return [Voice(VOICES[(i + i // SENTENCES) % len(VOICES)], 175, 50) for i in range(count)]
    names = rng.permutation(HELDOUT_VOICES)
    return [
        Voice(str(names[i % len(names)]), int(rng.integers(130, 201)), int(rng.integers(25, 76)))
        for i in range(count)
    ]


def speak(voice: Voice, ssml: str, workdir: Path) -> FloatArray:
    """espeak-ng (SSML) → 16 kHz mono float32 (through sox, without its random dither:
    the same text and voice give the same samples), without its leading and trailing
    silence."""
    raw, out = workdir / "say.wav", workdir / "say16.wav"
    command = ["espeak-ng", "-m", "-v", voice.name, "-s", str(voice.rate), "-p", str(voice.pitch)]
    subprocess.run([*command, "-w", str(raw), f"<speak>{ssml}</speak>"], check=True)
    subprocess.run(
        ["sox", "-V1", "-D", str(raw), "-r", "16000", "-c", "1", "-b", "16", str(out)], check=True
    )
    audio = read_wav(out)
    loud = np.flatnonzero(np.abs(audio) > 0.01)
    return audio[loud[0] : loud[-1] + 1] if len(loud) else audio


def longest_pause(audio: FloatArray) -> tuple[int, int]:
    """(first, last + 1) sample of the longest quiet run inside `audio`."""
    quiet = np.concatenate([[False], np.abs(audio) <= 0.01, [False]])
    edges = np.flatnonzero(np.diff(quiet.astype(np.int8)))
    starts, ends = edges[::2], edges[1::2]
    longest = int(np.argmax(ends - starts))
    return int(starts[longest]), int(ends[longest])


def build(which: str, seed: int = 46) -> list[TurnClip]:
    """The set's clips, spoken now (espeak-ng, sox)."""
    rng = np.random.default_rng(seed + (0 if which == "tune" else 1))
    complete = (TUNE_COMPLETE if which == "tune" else HELDOUT_COMPLETE) * VOICES_PER_SENTENCE
    incomplete = (TUNE_INCOMPLETE if which == "tune" else HELDOUT_INCOMPLETE) * VOICES_PER_SENTENCE
    chosen = voices(which, len(complete) + len(incomplete), rng)
    lead = np.zeros(int(0.3 * SAMPLE_RATE), np.float32)
    tail = np.zeros(int(TAIL * SAMPLE_RATE), np.float32)
    clips: list[TurnClip] = []
    with tempfile.TemporaryDirectory() as folder:
        for text, voice in zip(complete, chosen, strict=False):
            speech = speak(voice, text, Path(folder))
            end = len(lead) + len(speech)
            audio = np.concatenate([lead, speech, tail])
            clips.append(TurnClip(f"{which}/complete/{voice.label()}", audio, True, end, 0))
        for (first, rest), voice in zip(incomplete, chosen[len(complete) :], strict=False):
            pause_ms = int(rng.uniform(500, 800))
            ssml = f'{first} <break time="{pause_ms}ms"/> {rest}'
            speech = speak(voice, ssml, Path(folder))
            stop, resume = longest_pause(speech)
            audio = np.concatenate([lead, speech, tail])
            name = f"{which}/incomplete/{voice.label()}"
            clips.append(TurnClip(name, audio, False, len(lead) + stop, len(lead) + resume))
    return clips


@dataclass(frozen=True, slots=True)
class Outcome:
    clip: TurnClip
    first_end: int | None  # the sample position at which the first utterance ended
    early: bool  # incomplete, closed inside its pause
    late: bool  # complete, closed after TURN_SILENCE_MS plus a window

    @property
    def close_delay(self) -> float | None:
        """Seconds from the speech's end to the utterance's end being decided."""
        if self.first_end is None:
            return None
        return (self.first_end - self.clip.speech_end) / SAMPLE_RATE


def words_of(recognizer: Recognizer, segmenter: SegmenterConfig) -> TurnWords:
    """The turn's words so far, as the live actor has them: the speculative final, decoded
    from the utterance's audio up to the first silent window (the check's audio less the
    windows of silence heard since)."""
    silent = round(segmenter.turn_silence * SAMPLE_RATE / WINDOW) - 1

    async def words(check: TurnCheck) -> bool:
        audio = check.audio[: len(check.audio) - silent * WINDOW]
        (heard,) = recognizer.transcribe([Utterance(audio)])
        return ends_unfinished(heard.text, "en")

    return words


async def run_clip(
    clip: TurnClip,
    segmenter: SegmenterConfig,
    vad: SileroVad,
    turns: TurnBatcher | None,
    words: TurnWords | None = None,
) -> Outcome:
    pipeline = AudioPipeline(
        FrameDecoder(Encoding.PCM_F32LE, SAMPLE_RATE),
        DirectScorer(vad),
        segmenter,
        turns=turns,
        turn_words=words,
    )
    first_end: int | None = None
    for offset in range(0, len(clip.audio), FRAME):
        events = await pipeline.push(clip.audio[offset : offset + FRAME])
        if first_end is None and any(isinstance(e, UtteranceEnded) for e in events):
            first_end = pipeline.position
    early = not clip.complete and first_end is not None and first_end < clip.resume
    allowed = segmenter.turn_silence + 2 * WINDOW / SAMPLE_RATE  # windows' and VAD's slack
    delay = None if first_end is None else (first_end - clip.speech_end) / SAMPLE_RATE
    late = clip.complete and (delay is None or delay > allowed)
    return Outcome(clip, first_end, early, late)


def report(name: str, outcomes: Sequence[Outcome]) -> str:
    complete = [o for o in outcomes if o.clip.complete]
    incomplete = [o for o in outcomes if not o.clip.complete]
    early = sum(o.early for o in incomplete)
    late = sum(o.late for o in complete)
    delays = [d for o in complete if (d := o.close_delay) is not None]
    return (
        f"{name}: early close {early}/{len(incomplete)} incomplete turns, "
        f"late close {late}/{len(complete)} complete turns; complete turns closed "
        f"{np.median(delays):.3f} s (median) after their speech"
    )


def cost(repeats: int = 10) -> None:
    """Wall ms per decision on one thread: the features, then the model, at batches 1, 4, 8
    (5 s turns of real speech, the minimum of `repeats` runs)."""
    from session.turn_features import log_mel

    model = SmartTurn()
    model.warmup()
    turn = build("tune")[0].audio[: 5 * SAMPLE_RATE]
    started = time.perf_counter()
    for _ in range(repeats):
        log_mel(turn)
    features = (time.perf_counter() - started) / repeats * 1000
    print(f"features: {features:.1f} ms per turn")
    for batch in (1, 4, 8):
        runs = []
        for _ in range(repeats):
            started = time.perf_counter()
            model.probabilities([turn] * batch)
            runs.append(time.perf_counter() - started)
        print(f"batch {batch}: {min(runs) / batch * 1000:.1f} ms per decision (features included)")


async def main(args: argparse.Namespace) -> None:
    if args.cost:
        cost()
        return
    vad = SileroVad()
    turns = None if args.off else TurnBatcher(SmartTurn())
    segmenter = SegmenterConfig(
        min_silence=0.4,
        turn_silence=0.0 if args.off else args.silence / 1000,
        turn_threshold=args.threshold,
    )
    words = None
    if args.words and turns is not None:
        recognizer = load_whisper(model_config(Settings()))
        recognizer.warmup()
        words = words_of(recognizer, segmenter)
    for which in ("tune", "heldout") if args.set == "both" else (args.set,):
        clips = build(which)
        started = time.perf_counter()
        outcomes = [await run_clip(clip, segmenter, vad, turns, words) for clip in clips]
        for o in outcomes:
            flags = "EARLY" if o.early else "LATE" if o.late else "ok"
            delay = o.close_delay
            shown = "-" if delay is None else f"{delay:.3f}"
            print(f"  {o.clip.name:48s} closed {shown:>7s} s after speech  {flags}")
        print(report(which, outcomes), f"({time.perf_counter() - started:.1f} s)")
    if turns is not None:
        print(f"turn model: {turns.calls} calls, {turns.turns} turns")
        turns.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", choices=("tune", "heldout", "both"), default="both")
    parser.add_argument("--threshold", type=float, default=0.5)
    parser.add_argument("--silence", type=float, default=192.0, help="TURN_SILENCE_MS")
    parser.add_argument("--off", action="store_true", help="the fixed silence rule alone")
    parser.add_argument(
        "--words",
        action="store_true",
        help="also hold turns whose words stop unfinished (TURN_WORDS; the default model)",
    )
    parser.add_argument("--cost", action="store_true", help="time a decision, then stop")
    asyncio.run(main(parser.parse_args()))
