"""The committer's prompts: each final after its source's previous finals, in order.

Scheduling logic over the real scheduler and a fake recognizer that records each
utterance's prompt; tests/engine/test_prompts.py has what the model does with them.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from bench.fake_recognizer import FakeRecognizer
from engine.api import Priority
from engine.scheduling.scheduler import BatchScheduler
from session.committer import Committer, CommitterConfig
from session.final_order import PendingFinal
from session.segmenter import UtteranceEnded
from store.memory import MemoryStore
from store.records import FinalRecord
from wire.messages import ServerMessage


class _Nowhere:
    def final(self, record: FinalRecord, payload: str) -> None:
        return None

    def message(self, message: ServerMessage) -> None:
        return None

    def relabelled(self, speakers: Mapping[str, str]) -> None:
        return None


def committer(
    scheduler: BatchScheduler,
    *,
    prompts: bool = False,
    left_context: float = 0.0,
    context_wait: float | None = None,
    language: str | None = "en",
    context_languages: frozenset[str] | None = None,
    context_after_flush: bool = False,
) -> Committer:
    """A source's committer on `scheduler` that logs to a MemoryStore and sends nowhere
    (`language` None: detected, by a model that knows en and es)."""
    config = CommitterConfig(
        session_id="s",
        participant="p",
        priority=Priority.FINAL,
        timing=False,
        requested_language=language,
        model_languages=frozenset({"en"} if language == "en" else {"en", "es"}),
        prompts=prompts,
        left_context=left_context,
        context_wait=context_wait,
        context_languages=context_languages,
        context_after_flush=context_after_flush,
    )
    return Committer(config, scheduler, MemoryStore(), None, _Nowhere())


def utterance(index: int, samples: int) -> UtteranceEnded:
    start = index * 100_000
    return UtteranceEnded(index, start, start + samples, np.zeros(samples, np.float32))


async def test_each_final_is_decoded_after_the_finals_before_it(
    fake: tuple[FakeRecognizer, BatchScheduler],
) -> None:
    """Three finals cut at once: the second and third wait for the one before them and
    carry the text so far; a partial's prompt is unknown while a final is open."""
    recognizer, scheduler = fake
    source = committer(scheduler, prompts=True)
    assert source.prompt_for_partial() == ""
    pending: list[PendingFinal] = [
        await source.submit(utterance(i, n)) for i, n in enumerate((1000, 2000, 3000))
    ]
    assert [p.future is not None for p in pending] == [True, False, False]
    assert source.prompt_for_partial() is None
    for p in pending:
        await source.commit(p)
    assert recognizer.prompts == [(1000, ""), (2000, "n=1000"), (3000, "n=1000 n=2000")]
    assert source.prompt_for_partial() == "n=1000 n=2000 n=3000"


async def test_a_final_the_guard_emptied_clears_the_prompt(
    fake: tuple[FakeRecognizer, BatchScheduler],
) -> None:
    recognizer, scheduler = fake
    recognizer.empty_on = 2000
    source = committer(scheduler, prompts=True)
    pending = [await source.submit(utterance(i, n)) for i, n in enumerate((1000, 2000, 3000))]
    for p in pending:
        await source.commit(p)
    assert recognizer.prompts == [(1000, ""), (2000, "n=1000"), (3000, "")]
    assert source.empty == 1


async def test_prompts_off_submits_every_final_at_once_without_a_prompt(
    fake: tuple[FakeRecognizer, BatchScheduler],
) -> None:
    recognizer, scheduler = fake
    source = committer(scheduler, prompts=False)
    pending = [await source.submit(utterance(i, n)) for i, n in enumerate((1000, 2000))]
    assert all(p.future is not None for p in pending)
    assert source.prompt_for_partial() == ""
    for p in pending:
        await source.commit(p)
    assert recognizer.prompts == [(1000, ""), (2000, "")]
