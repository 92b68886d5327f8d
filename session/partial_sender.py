"""A live source's partial transcripts: admitted, recognized, delivered, or dropped.

Every `PartialDue` the segmenter proposes goes to the engine at `Priority.PARTIAL`: the
scheduler keeps the newest per source (a newer one supersedes it) and spends the
partials' share of the model on utterances that have shown no partial yet (an empty
draft) first, then on the stalest sources, so under load every stream's partials slow
down alike. A result goes to the client's outbox (merged with any partial
not yet sent) and to the meeting's listeners, unless its utterance's final was committed
meanwhile (stale) or it came back empty. A partial's text is also the next request's
decoding draft for the same utterance. A partial decodes with its final's prompt (the
source's previous finals); while the final before it is still open that prompt is not
known yet, and the partial is not sent. Every partial not sent is counted by reason:
queue_full, superseded, cancelled (its utterance ended, or the stream, before it ran),
stale (its result came after its final), empty (the recognizer gave no text), failed,
waiting.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from engine.api import (
    Priority,
    Recognition,
    RecognitionRequest,
    RecognitionResult,
    RequestSuperseded,
    SchedulerError,
    SchedulerFull,
    Utterance,
)
from session.committer import Committer
from session.outbox import Outbox, OutboxState
from session.pipeline import seconds
from session.segmenter import PartialDue, UtteranceMayEnd
from session.telemetry import Telemetry
from store.api import Store
from wire import build

logger = logging.getLogger(__name__)


class PartialSender:
    def __init__(
        self,
        committer: Committer,
        meeting_id: str,
        recognition: Recognition,
        store: Store,
        outbox: Outbox,
        telemetry: Telemetry,
        clock: Callable[[], float],
    ) -> None:
        """`committer`: the source's, for its language and what it has committed."""
        self._committer = committer
        self._session_id = committer.config.session_id
        self._participant = committer.config.participant
        self._meeting_id = meeting_id
        self._recognition = recognition
        self._store = store
        self._outbox = outbox
        self._telemetry = telemetry
        self._clock = clock
        self._tasks: set[asyncio.Task[None]] = set()  # partials awaiting their result
        self._last: tuple[int, float] | None = None  # (utterance index, sent at)
        self._draft: tuple[int, str] = (-1, "")  # the latest partial text per utterance
        self.sent = 0
        self.dropped = 0

    def draft_for(self, index: int) -> str:
        """The latest partial text of utterance `index`, or nothing."""
        drafted, text = self._draft
        return text if drafted == index else ""

    def speculative(self, event: UtteranceMayEnd) -> Utterance | None:
        """What the final of `event`'s utterance would decode, with its latest partial as
        the draft (None while not known: `Committer.speculative_utterance`)."""
        return self._committer.speculative_utterance(event, self.draft_for(event.index))

    async def submit(self, event: PartialDue) -> None:
        """Send the partial to the engine; deliver its result when it comes."""
        prompt = self._committer.prompt_for_partial()
        if prompt is None:  # an earlier final is still open: this partial's prompt is not known
            self._drop("waiting")
            return
        utterance = Utterance(
            event.audio,
            self._committer.language,
            self.draft_for(event.index),
            prompt,
            partial=True,
            keyterms=self._committer.keyterms,
        )
        request = RecognitionRequest(self._committer.config.engine_key, Priority.PARTIAL, utterance)
        try:
            future = await self._recognition.submit(request)
        except SchedulerFull:
            self._drop("queue_full")
            return
        except SchedulerError:  # the engine stopped or died: the final's commit says so
            self._drop("failed")
            return
        task = asyncio.create_task(self._deliver(event, future))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def tasks(self) -> list[asyncio.Task[None]]:
        """The partials still awaiting their result (the actor cancels them at the end)."""
        return list(self._tasks)

    async def _deliver(self, event: PartialDue, future: asyncio.Future[RecognitionResult]) -> None:
        try:
            result = await future
        except RequestSuperseded:
            self._drop("superseded")
            return
        except asyncio.CancelledError:  # its utterance ended while it waited, or the stream
            self._drop("cancelled")
            raise
        except SchedulerError:
            self._drop("failed")
            logger.warning("partial of session %s failed", self._session_id, exc_info=True)
            return
        text = result.transcription.text.strip()
        if event.index <= self._committer.committed_index:
            self._drop("stale")
            return
        if not text:
            self._drop("empty")
            return
        self._draft = (event.index, text)
        message = build.transcript_partial(
            utterance_id=f"{self._session_id}-{event.index}",
            participant=self._participant,
            text=self._committer.text_filter.text(text, partial=True),  # the draft: the model's
            start=seconds(event.start),
            end=seconds(event.end),
        )
        payload = build.encode(message)
        if self._outbox.state is OutboxState.OPEN:
            self._outbox.put_partial(message["utterance_id"], payload)
        self.sent += 1
        now = self._clock()
        previous = self._last
        since = now - previous[1] if previous and previous[0] == event.index else None
        self._last = (event.index, now)
        self._telemetry.partial_sent(since)
        await self._store.publish(self._meeting_id, payload.encode())

    def _drop(self, reason: str) -> None:
        self.dropped += 1
        self._telemetry.partial_dropped(reason)
