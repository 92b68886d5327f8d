# One concept, 492 lines: one state machine over VAD windows; speech, pauses, dips, cuts,
# speculation and turns all read and move the same counters at each window.
"""Sans-I/O utterance segmenter: VAD windows in, typed events out.

`Segmenter.push(window, probability)` takes each 32 ms window with its speech
probability and returns what happened: speech started, a partial is due, an utterance
ended (with its audio), speech stopped. It does no I/O and no awaits, so it is tested
with plain arrays.

Hysteresis: speech starts when a window scores >= `threshold` and continues while
windows score >= `threshold - hysteresis`; it ends after `min_silence` of windows below
that. Each utterance carries `pre_roll` of audio before the onset and `post_roll`
after the last speech window.

Long speech is cut so finals keep coming: once an utterance is `soft_max_utterance`
long, a pause of `soft_pause` ends it (a sentence break, not a word gap); in its last
`cut_search` seconds before `max_utterance`, the first window that is not speech (a word
gap) ends it at once; only speech with no such gap at all is cut at `max_utterance`, at
the quietest window of those seconds, the rest starting the next utterance. That last
cut is the only one decided after the fact: its final's `end` lags the live audio by up
to `cut_search`, which a client sees as latency (a 16.7 s read clip's cut at its
quietest window came 1.5 s after the words it ended on).

A client's cut (`finalize`, Deepgram's `Finalize`, OpenAI's `commit`) ends the utterance
at once. In a pause it ends as at an endpoint. In mid-speech (`finalize`) it holds all
the audio received, and the speech goes on as the next utterance from exactly there (no
window of it is dropped, no `SpeechStopped`: the speaker did not stop), whose
`UtteranceEnded.continues` says it begins inside the speech of the one before: decoded
alone it would start in the middle of a word, so its final is decoded behind that one
(session/committer.py). An utterance still too short to be a final is not cut: its audio
goes on into the next final.

Speculation (`speculate_after` > 0): once an utterance has been silent that long, the
audio its final would carry is known, but the endpoint is `min_silence` away.
`UtteranceMayEnd` hands that audio out early, once per silence run, so the final can be
decoded while the endpoint (or a client's flush) is still being waited for; if speech
resumes before it, `UtteranceResumed` withdraws it. An utterance that ends in the same
silence run (endpoint, a client's cut in the pause, the end of the audio) ends with
exactly the audio speculated: only silence came after it. A `speculate_after` shorter
than `post_roll` speculates sooner with the post-roll heard so far, and that shorter
post-roll is then the final's (docs/performance.md#a-flush-answered-from-a-speculation-benchttfs).
A cut (`max_utterance`) ends the utterance elsewhere: its `UtteranceEnded` then differs
from what was speculated.

A weak dip: windows that score under `threshold` but not under `threshold - hysteresis`
keep an utterance open (hysteresis), yet a client's VAD, whose bar is higher (pipecat's
0.7), hears silence there and flushes: a recording's noise floor at its end scores
0.41-0.47 for 200 ms, and that flush found no speculation (the server had heard no silence
yet) and was decoded at the flush. So once `WEAK_DIP` windows in a row score in that band,
the utterance as if it had ended at its last window over `threshold` is speculated
(`UtteranceMayEnd`, the post-roll heard so far), partials pause, and a client's cut in
that dip ends the utterance there, as at an endpoint (the dip's windows become the next
utterance's pre-roll). A window over `threshold` withdraws it (`UtteranceResumed`); if the
dip turns into silence, the silence's own speculation replaces it, and an endpoint ends the
utterance as before, its dip in. On the corpus, 2 dips in 5.3 min of speech went back to
speech, and 36 of 37 speech ends crossed the band in one window (no dip speculation).

End of turn by a model (`turn_silence` > 0): once an utterance has been silent that long
(shorter than `min_silence`), `TurnCheck` asks whether the speaker has finished, with the
utterance's audio so far; the caller answers with `decide(index, probability,
unfinished=...)` (session/turn.py; `unfinished`: its words so far stop where a sentence
cannot end, session/turn_words.py). A complete turn (probability >= `turn_threshold`, its
words not unfinished) ends the utterance at once; an incomplete one waits for speech up
to `turn_hold` of silence (then it ends all the same); no answer (None: the model failed
or was too busy) leaves the `min_silence` rule. Until the answer comes, `turn_hold` bounds
the wait. With `turn_events`, every utterance that ends at a pause (by either rule, or when
the audio is over) is preceded by `TurnEnded`; a probability between `turn_eager` and
`turn_threshold` says `TurnEnded` with `eager` at once (the utterance stays open), and
`TurnResumed` if speech comes back. Cuts of long speech and a client's cuts end no turn.

Times are samples on the stream's own timeline (16 kHz), starting at `start_sample`
(non-zero for a resumed stream).
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from engine.api import SAMPLE_RATE
from session.vad import WINDOW

FloatArray = npt.NDArray[np.float32]

WEAK_DIP = 2  # windows in a row under the threshold, not under the hysteresis band: a dip


@dataclass(frozen=True, slots=True)
class SegmenterConfig:
    threshold: float = 0.5
    hysteresis: float = 0.15
    min_silence: float = 0.4  # seconds of non-speech that end an utterance (12 windows)
    min_speech: float = 0.25  # shorter bursts are dropped (no final)
    pre_roll: float = 0.2
    post_roll: float = 0.1
    max_utterance: float = 15.0
    soft_max_utterance: float = 8.0  # past this, a `soft_pause` is enough to end it
    soft_pause: float = 0.15
    cut_search: float = 3.0  # a hard cut falls within the last this-many seconds
    partial_interval: float = 0.5  # seconds of new audio between partials; 0 disables
    speculate_after: float = 0.0  # silence after which the final's audio is handed out; 0: off
    turn_silence: float = 0.0  # silence after which the turn model is asked; 0: no model
    turn_hold: float = 1.0  # most silence an utterance the model judged incomplete waits
    turn_threshold: float = 0.5  # a turn this likely complete ends at once
    turn_eager: float = 0.0  # an eager end from this probability (below turn_threshold); 0: none

    def __post_init__(self) -> None:
        if not 0 < self.threshold < 1 or not 0 <= self.hysteresis < self.threshold:
            raise ValueError("need 0 < threshold < 1 and 0 <= hysteresis < threshold")
        if self.max_utterance < 2 * self.min_silence or self.max_utterance > 30:
            raise ValueError("max_utterance must lie in [2 × min_silence, 30] seconds")
        if min(self.min_silence, self.min_speech, self.pre_roll, self.post_roll) < 0:
            raise ValueError("durations must not be negative")
        if self.partial_interval < 0 or self.speculate_after < 0:
            raise ValueError("partial_interval and speculate_after must not be negative")
        if not 0 < self.soft_max_utterance <= self.max_utterance:
            raise ValueError("soft_max_utterance must lie in (0, max_utterance]")
        if not 0 < self.cut_search <= self.max_utterance / 2:
            raise ValueError("cut_search must lie in (0, max_utterance / 2]")
        if self.turn_silence and not 0 < self.turn_silence < self.min_silence <= self.turn_hold:
            raise ValueError("need 0 < turn_silence < min_silence <= turn_hold")
        if not 0 < self.turn_threshold <= 1 or not 0 <= self.turn_eager <= self.turn_threshold:
            raise ValueError("need 0 < turn_threshold <= 1 and 0 <= turn_eager <= turn_threshold")


class SegmenterState(enum.Enum):
    SILENCE = "silence"
    SPEECH = "speech"


@dataclass(frozen=True, slots=True)
class SpeechStarted:
    sample: int
    index: int  # the utterance's number if it becomes one (a burst too short does not)


@dataclass(frozen=True, slots=True)
class SpeechStopped:
    sample: int


@dataclass(frozen=True, slots=True)
class PartialDue:
    index: int  # the utterance's number within this stream
    start: int
    end: int
    audio: FloatArray


@dataclass(frozen=True, slots=True)
class UtteranceEnded:
    index: int
    start: int
    end: int
    audio: FloatArray
    # It starts where a client's cut split the speech (`Segmenter.finalize`): no pause
    # lies between it and the utterance before it.
    continues: bool = False


@dataclass(frozen=True, slots=True)
class UtteranceMayEnd:
    """The utterance has been silent long enough that, if it ends in this silence, its
    `UtteranceEnded` will carry exactly this index, start, end and audio."""

    index: int
    start: int
    end: int
    audio: FloatArray
    continues: bool = False


@dataclass(frozen=True, slots=True)
class UtteranceResumed:
    """Speech came back after an `UtteranceMayEnd`: that audio will not be a final."""

    index: int


@dataclass(frozen=True, slots=True)
class TurnCheck:
    """Ask the turn model whether utterance `index` ends the speaker's turn (`decide`)."""

    index: int
    audio: FloatArray


@dataclass(frozen=True, slots=True)
class TurnEnded:
    """The speaker's turn ended at `sample` with utterance `index` (its `UtteranceEnded`
    follows), or, `eager`, probably did: the utterance is still open (`TurnResumed` or
    another `TurnEnded` follows). `probability`: the turn model's; None by the silence rule."""

    index: int
    sample: int
    probability: float | None
    eager: bool = False


@dataclass(frozen=True, slots=True)
class TurnResumed:
    """Speech came back after an eager `TurnEnded` of utterance `index`."""

    index: int
    sample: int


SegmentEvent = (
    SpeechStarted
    | SpeechStopped
    | PartialDue
    | UtteranceEnded
    | UtteranceMayEnd
    | UtteranceResumed
    | TurnCheck
    | TurnEnded
    | TurnResumed
)


class Segmenter:
    def __init__(
        self,
        config: SegmenterConfig,
        *,
        start_sample: int = 0,
        first_index: int = 0,
        turn_events: bool = False,
    ) -> None:
        self.config = config
        self.turn_events = turn_events  # say TurnEnded / TurnResumed
        self.state = SegmenterState.SILENCE
        self.next_index = first_index
        self._position = start_sample  # sample just after the last pushed window
        self._stream_start = start_sample
        self._pre_roll: deque[FloatArray] = deque(maxlen=_windows(config.pre_roll))
        self._windows: list[FloatArray] = []  # the current utterance's audio, by window
        self._probabilities: list[float] = []
        self._utterance_start = 0
        self._last_speech_end = 0  # sample after the last window scored as speech
        self._strong_end = 0  # sample after the last window scored over `threshold`
        self._weak = 0  # windows in a row in the hysteresis band, up to now (a dip)
        self._onset = 0
        self._silence = 0  # consecutive non-speech windows
        self._last_partial = 0
        self._silence_windows = max(1, _windows(config.min_silence))
        self._post_roll_windows = _windows(config.post_roll)
        self._max_windows = _windows(config.max_utterance)
        self._soft_max_windows = _windows(config.soft_max_utterance)
        self._soft_pause_windows = max(1, _windows(config.soft_pause))
        self._cut_search_windows = max(1, _windows(config.cut_search))
        # Past this many windows a word gap ends the utterance (the cut zone).
        self._gap_cut_windows = self._max_windows - self._cut_search_windows
        self._partial_samples = round(config.partial_interval * SAMPLE_RATE)
        # Silent windows after which the final's audio is handed out (at least one).
        self._speculate_windows = (
            max(1, _windows(config.speculate_after)) if config.speculate_after > 0 else 0
        )
        self._speculated = False  # an UtteranceMayEnd is out for this silence run or dip
        # The windows of a dip after which it is speculated (0: speculation is off).
        self._dip_windows = max(WEAK_DIP, self._speculate_windows) if self._speculate_windows else 0
        self._speculated_ending = (0, 0)  # its end and the windows it kept (`_ending`)
        self._turn_windows = _windows(config.turn_silence) if config.turn_silence else 0
        self._hold_windows = max(1, _windows(config.turn_hold))
        self._endpoint = self._silence_windows  # silent windows that end this silence run
        self._asked = False  # a TurnCheck is out for this silence run, not yet decided
        self._eager = False  # an eager TurnEnded is out for this silence run
        self._probability: float | None = None  # the turn model's for this silence run
        self._continues = False  # the utterance in progress began at a client's cut

    @property
    def position(self) -> int:
        return self._position

    def push(self, window: FloatArray, probability: float) -> list[SegmentEvent]:
        """Feed one VAD window (WINDOW samples) and its speech probability."""
        if len(window) != WINDOW:
            raise ValueError(f"a window is {WINDOW} samples, got {len(window)}")
        window_start = self._position
        self._position += WINDOW
        if self.state is SegmenterState.SILENCE:
            if probability < self.config.threshold:
                self._pre_roll.append(window)
                return []
            return self._start(window, probability, window_start)
        self._windows.append(window)
        self._probabilities.append(probability)
        events: list[SegmentEvent] = []
        if probability >= self.config.threshold - self.config.hysteresis:
            strong = probability >= self.config.threshold
            self._last_speech_end = self._position
            if self._silence and self._eager:
                events.append(TurnResumed(self.next_index, window_start))
            # A dip's speculation holds through the dip; a silence's does not.
            if self._speculated and (strong or not self._weak):
                self._speculated = False
                events.append(UtteranceResumed(self.next_index))
            if strong:
                self._strong_end, self._weak = self._position, 0
            else:
                self._weak += 1
            self._silence = 0
            self._new_silence_run()
        else:
            self._silence += 1
            self._weak = 0
        if self._silence >= self._endpoint:
            return [*events, *self._end(self._last_speech_end, turn=True)]
        if (
            self._silence >= self._soft_pause_windows
            and len(self._windows) >= self._soft_max_windows
        ) or (self._silence and len(self._windows) >= self._gap_cut_windows):
            return self._end(self._last_speech_end)
        if len(self._windows) >= self._max_windows:
            return [*events, *self._cut()]
        if self._silence and self._silence == self._turn_windows and self._speaks():
            self._asked = True
            self._endpoint = self._hold_windows  # until the answer comes
            events.append(TurnCheck(self.next_index, self._audio()))
        if self._silence and self._silence == self._speculate_windows and self._speaks():
            return [*events, self._speculate(self._last_speech_end)]
        if self._weak and self._weak == self._dip_windows and self._speaks(self._strong_end):
            return [*events, self._speculate(self._strong_end)]
        if (
            self._partial_samples
            and self._position - self._last_partial >= self._partial_samples
            and self._silence == 0
            and not self._speculated  # a dip's speculation is out: no partial beside it
        ):
            self._last_partial = self._position
            events.append(
                PartialDue(self.next_index, self._utterance_start, self._position, self._audio())
            )
        return events

    def flush(self) -> list[SegmentEvent]:
        """End the utterance in progress now: the audio is over (`stop`, the end of a file)."""
        if self.state is SegmenterState.SILENCE:
            return []
        return self._end(self._last_speech_end, turn=True)

    def decide(
        self, index: int, probability: float | None, *, unfinished: bool = False
    ) -> list[SegmentEvent]:
        """The turn model's answer to the `TurnCheck` of utterance `index`: the probability
        that the turn is complete, or None (not scored: the `min_silence` rule applies);
        `unfinished`: its words so far stop where a sentence cannot end
        (session/turn_words.py), so it waits as an incomplete turn does, whatever the
        probability. An answer that comes after speech resumed (or the utterance ended)
        changes nothing."""
        if not self._asked or index != self.next_index or self.state is SegmenterState.SILENCE:
            return []
        self._asked = False
        self._probability = probability
        if unfinished:
            self._endpoint = self._hold_windows
        elif probability is None:
            self._endpoint = self._silence_windows
        elif probability >= self.config.turn_threshold:
            self._endpoint = self._silence
        else:
            self._endpoint = self._hold_windows
        if self._silence >= self._endpoint:
            return self._end(self._last_speech_end, turn=True)
        if unfinished or not self.turn_events:
            return []
        eager = self.config.turn_eager
        if probability is not None and eager and probability >= eager:
            self._eager = True
            return [TurnEnded(index, self._last_speech_end, probability, eager=True)]
        return []

    def finalize(self) -> list[SegmentEvent]:
        """A client's cut (`finalize`): end the utterance in progress now. In a pause (a
        window of silence or more) it ends as at an endpoint, with the audio an endpoint
        would give it (so a speculation made in that silence holds), and so in a dip, at its
        last window over the threshold (module doc); in mid-speech it ends with
        all the audio received and the speech goes on as the next utterance, which
        `continues` it; one too short to be a final yet is left to go on."""
        if self.state is SegmenterState.SILENCE:
            return []
        if self._silence:  # the VAD heard the speech stop: an endpoint, trailing silence trimmed
            return self._end(self._last_speech_end)
        if self._weak >= WEAK_DIP and self._speaks(self._strong_end):  # in a dip: as at an endpoint
            return self._end(self._strong_end)
        if not self._speaks():
            return []
        event = self._split(len(self._windows))
        self._continues = True
        return [event]

    # ------------------------------------------------------------------ internals

    def _start(
        self, window: FloatArray, probability: float, window_start: int
    ) -> list[SegmentEvent]:
        self.state = SegmenterState.SPEECH
        self._windows = [*self._pre_roll, window]
        self._probabilities = [0.0] * len(self._pre_roll) + [probability]
        self._pre_roll.clear()
        self._utterance_start = self._position - WINDOW * len(self._windows)
        self._onset = window_start
        self._last_speech_end = self._strong_end = self._position
        self._last_partial = self._position
        self._silence = self._weak = 0
        self._new_silence_run()
        return [SpeechStarted(window_start, self.next_index)]

    def _new_silence_run(self) -> None:
        """Speech (re)started: the next pause is judged afresh."""
        self._endpoint = self._silence_windows
        self._asked = self._eager = False
        self._probability = None

    def _audio(self, windows: int | None = None) -> FloatArray:
        return np.concatenate(self._windows[:windows]).astype(np.float32, copy=False)

    def _ending(self, speech_end: int) -> tuple[int, int]:
        """Where an utterance ended at `speech_end` ends (its post-roll in, as far as it
        came), and how many of its windows that keeps."""
        end = min(self._position, speech_end + self._post_roll_windows * WINDOW)
        return end, max(0, (end - self._utterance_start) // WINDOW)

    def _speaks(self, until: int | None = None) -> bool:
        """Whether the utterance so far (or up to `until`) is long enough speech to make a
        final."""
        end = self._last_speech_end if until is None else until
        return end - self._onset >= self.config.min_speech * SAMPLE_RATE

    def _speculate(self, speech_end: int) -> UtteranceMayEnd:
        """Hand out the final the utterance would have if its speech ended at `speech_end`."""
        self._speculated = True
        end, keep = self._speculated_ending = self._ending(speech_end)
        return UtteranceMayEnd(
            self.next_index, self._utterance_start, end, self._audio(keep), self._continues
        )

    def _end(self, speech_end: int, *, turn: bool = False) -> list[SegmentEvent]:
        """Close the utterance at `speech_end` plus post-roll (as speculated, if it was in
        this silence run); return to silence. `turn`: at a pause that ends the speaker's
        turn (said with `turn_events`)."""
        end, keep = self._speculated_ending if self._speculated else self._ending(speech_end)
        events: list[SegmentEvent] = [SpeechStopped(speech_end)]
        self._speculated = False
        if speech_end - self._onset >= self.config.min_speech * SAMPLE_RATE:
            audio = self._audio(keep)
            if turn and self.turn_events:
                events.insert(0, TurnEnded(self.next_index, speech_end, self._probability))
            events.append(
                UtteranceEnded(self.next_index, self._utterance_start, end, audio, self._continues)
            )
            self.next_index += 1
        self._continues = False
        # Windows after the utterance's end become the pre-roll of the next one.
        self._pre_roll.extend(self._windows[keep:])
        self._windows, self._probabilities = [], []
        self.state = SegmenterState.SILENCE
        self._silence = self._weak = 0
        self._new_silence_run()
        return events

    def _cut(self) -> list[SegmentEvent]:
        """Split an over-long utterance at the quietest window of its last `cut_search`."""
        first = len(self._probabilities) - self._cut_search_windows
        tail = self._probabilities[first:]
        quietest = first + min(range(len(tail)), key=lambda i: (tail[i], -i))
        event = self._split(quietest + 1)
        self._continues = False  # a cut at the quietest window: the next starts cold
        return [event]

    def _split(self, keep: int) -> UtteranceEnded:
        """End the utterance after its first `keep` windows; the rest starts the next."""
        end = self._utterance_start + keep * WINDOW
        audio = self._audio(keep)
        event = UtteranceEnded(self.next_index, self._utterance_start, end, audio, self._continues)
        self.next_index += 1
        self._windows = self._windows[keep:]
        self._probabilities = self._probabilities[keep:]
        self._utterance_start = end
        self._onset = end
        self._last_partial = end
        self._speculated = False  # what was speculated was not this cut
        self._new_silence_run()
        return event


def _windows(seconds: float) -> int:
    return round(seconds * SAMPLE_RATE / WINDOW)
