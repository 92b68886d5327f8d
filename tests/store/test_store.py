"""Store semantics every backend shares: MemoryStore and RedisStore run the same tests."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from store.api import Store
from store.errors import ResumeTokenMismatch, SourceSuperseded, SubscriberLagged, UnknownResumeToken
from store.records import FinalRecord, NewFinal, SourceState
from tests.conftest import StoreFactory
from tests.support.redis_support import ManualClock
from tests.support.timeouts import MS
from wire.errors import ProtocolError


def new_final(state: SourceState, index: int, text: str | None = None) -> NewFinal:
    return NewFinal(
        utterance_id=f"{state.session_id}-{index}",
        session_id=state.session_id,
        participant=state.participant,
        text=text if text is not None else f"{state.meeting_id} {state.participant} {index}",
        start=index * 2.0,
        end=index * 2.0 + 1.5,
        language="en",
        origin=state.origin,
    )


async def emit(
    store: Store, state: SourceState, text: str | None = None
) -> tuple[FinalRecord, SourceState]:
    """What the session actor does on a final: log it together with the next state."""
    final = new_final(state, state.next_utterance, text)
    after = replace(
        state,
        acked_until=final.end,
        next_utterance=state.next_utterance + 1,
        context=(state.context + " " + final.text)[-200:],
    )
    record = await store.append_final(state.meeting_id, final, after)
    return record, after


async def next_event(events: AsyncIterator[bytes]) -> bytes:
    # Generous: it only bounds a failure (a loaded CI run has taken ~0.5 s for two Redis calls).
    return await asyncio.wait_for(anext(events), 10_000 * MS)


async def test_seq_gap_free_under_concurrent_sources(store: Store) -> None:
    """Eight sources appending at once get seqs 1..N, each once, and the log is in seq order."""
    sources = [(await store.create_source("m1", f"p{i}"))[0] for i in range(8)]

    async def actor(state: SourceState) -> list[FinalRecord]:
        records = []
        for _ in range(20):
            record, state = await emit(store, state)
            records.append(record)
        return records

    results = await asyncio.gather(*(actor(s) for s in sources))
    given = sorted(r.seq for records in results for r in records)
    assert given == list(range(1, 161))
    log = await store.finals("m1")
    assert [r.seq for r in log] == given
    assert {r.seq: r for records in results for r in records} == {r.seq: r for r in log}
    for records in results:  # each source's finals keep their order
        assert [r.seq for r in records] == sorted(r.seq for r in records)
    assert await store.last_seq("m1") == 160


async def test_finals_after_seq_and_empty_meeting(store: Store) -> None:
    """finals(after_seq) returns the tail; an unknown meeting reads as empty."""
    state, _ = await store.create_source("m1", "alice")
    for _ in range(5):
        _, state = await emit(store, state)
    assert [r.seq for r in await store.finals("m1", after_seq=3)] == [4, 5]
    assert await store.finals("m1", after_seq=5) == []
    assert [r.seq for r in await store.finals("m1", after_seq=-2)] == [1, 2, 3, 4, 5]
    assert await store.finals("nobody") == []
    assert await store.last_seq("nobody") == 0
    assert await store.meeting_config("nobody") is None


async def test_meetings_are_isolated(store: Store) -> None:
    """Finals of one meeting never show up in another; seqs are per meeting."""
    a, _ = await store.create_source("meeting-a", "alice")
    b, _ = await store.create_source("meeting-b", "alice")
    ra, _ = await emit(store, a, "in a")
    rb, _ = await emit(store, b, "in b")
    assert ra.seq == rb.seq == 1
    assert [r.text for r in await store.finals("meeting-a")] == ["in a"]
    assert [r.text for r in await store.finals("meeting-b")] == ["in b"]


async def test_bad_ids_are_refused_before_any_key_is_built(store: Store) -> None:
    """Meeting ids and participants outside the safe alphabet raise ProtocolError."""
    for bad in ["", "a b", "../x", "x:y", "*", "a" * 129]:
        with pytest.raises(ProtocolError):
            await store.finals(bad)
        with pytest.raises(ProtocolError):
            await store.create_source(bad, "alice")
    with pytest.raises(ProtocolError):
        await store.create_source("m1", "bad name")


async def test_meeting_config_first_writer_wins(store: Store) -> None:
    """The first source's config becomes the meeting's; later ones do not change it."""
    await store.create_source("m1", "alice", {"language": "en", "model": "tiny.en"})
    await store.create_source("m1", "bob", {"language": "de"})
    assert await store.meeting_config("m1") == {"language": "en", "model": "tiny.en"}
    await store.create_source("m2", "alice")
    assert await store.meeting_config("m2") == {}


async def test_final_and_source_state_are_one_write(store: Store) -> None:
    """After every append, resume returns exactly the state logged with that final."""
    state, token = await store.create_source("m1", "alice")
    assert (state.acked_until, state.next_utterance, state.context) == (0.0, 0, "")
    for _ in range(3):
        record, state = await emit(store, state)
        resumed = await store.resume_source("m1", token)
        assert resumed == replace(state, generation=resumed.generation)
        assert resumed.acked_until == record.end
        state = resumed


async def test_resume_token_binding_and_refusal(store: Store) -> None:
    """A token resumes only its own meeting and participant; others are refused by type."""
    state, token = await store.create_source("m1", "alice")
    await store.create_source("m2", "alice")
    resumed = await store.resume_source("m1", token, participant="alice")
    assert (resumed.session_id, resumed.generation) == (state.session_id, 2)
    with pytest.raises(ResumeTokenMismatch, match="participant"):
        await store.resume_source("m1", token, participant="mallory")
    with pytest.raises(ResumeTokenMismatch, match="meeting"):
        await store.resume_source("m2", token)
    with pytest.raises(ResumeTokenMismatch, match="meeting"):
        await store.resume_source("never-created", token)
    with pytest.raises(UnknownResumeToken):
        await store.resume_source("m1", "A" * 43)
    with pytest.raises(UnknownResumeToken):
        await store.resume_source("m1", "short")
    with pytest.raises(UnknownResumeToken):
        await store.resume_source("m1", "x" * 40 + "\n{*}")
    # a refused attempt did not take the source over
    assert (await store.resume_source("m1", token)).generation == 3


async def test_tokens_are_unguessable_and_distinct(store: Store) -> None:
    """Tokens are 43 url-safe characters (256 bits) and never repeat."""
    tokens = [(await store.create_source("m1", f"p{i}"))[1] for i in range(50)]
    assert len(set(tokens)) == 50
    assert all(len(t) == 43 for t in tokens)


async def test_resume_fences_the_older_session(store: Store) -> None:
    """Once a source is resumed, the old session's appends raise SourceSuperseded and
    change nothing; the new session continues the same utterance numbering."""
    old, token = await store.create_source("m1", "alice")
    _, old = await emit(store, old)
    new = await store.resume_source("m1", token)
    with pytest.raises(SourceSuperseded):
        await emit(store, old)
    assert [r.seq for r in await store.finals("m1")] == [1]
    record, new = await emit(store, new)
    assert (record.seq, record.utterance_id) == (2, f"{new.session_id}-1")
    assert (await store.resume_source("m1", token)).acked_until == new.acked_until


async def test_append_is_idempotent_per_utterance(store: Store) -> None:
    """Appending an utterance id that is already logged returns its seq and adds nothing."""
    state, _ = await store.create_source("m1", "alice")
    first, after = await emit(store, state)
    again = await store.append_final("m1", new_final(state, 0), after)
    assert again.seq == first.seq
    assert len(await store.finals("m1")) == 1


async def test_speakers_are_relabelled_in_the_log(store: Store) -> None:
    """A diarized final's speaker, changed by set_speakers, is what the log returns;
    finals without a speaker stay without one."""
    state, _ = await store.create_source("m1", "room")
    for speaker in ("S1", "S1", None):
        final = replace(new_final(state, state.next_utterance), speaker=speaker)
        after = replace(state, acked_until=final.end, next_utterance=state.next_utterance + 1)
        await store.append_final("m1", final, after)
        state = after
    await store.set_speakers("m1", {f"{state.session_id}-1": "S2"})
    assert [f.speaker for f in await store.finals("m1")] == ["S1", "S2", None]
    assert [f.speaker for f in await store.finals("m1", after_seq=1)] == ["S2", None]


async def test_append_checks_final_matches_source(store: Store) -> None:
    """A final of one source cannot be logged with another source's state."""
    alice, _ = await store.create_source("m1", "alice")
    bob, _ = await store.create_source("m1", "bob")
    with pytest.raises(ValueError):
        await store.append_final("m1", new_final(alice, 0), bob)
    with pytest.raises(ValueError):
        await store.append_final("m2", new_final(alice, 0), alice)


async def test_pubsub_fans_out_in_order(store: Store) -> None:
    """Every listener of a meeting gets every event in order; other meetings get none."""
    async with (
        store.subscribe("m1") as one,
        store.subscribe("m1") as two,
        store.subscribe("m2") as other,
    ):
        events = [f"event {i}".encode() for i in range(50)]
        for event in events:
            await store.publish("m1", event)
        await store.publish("m2", b"for m2")
        assert [await next_event(one) for _ in events] == events
        assert [await next_event(two) for _ in events] == events
        assert await next_event(other) == b"for m2"
    await store.publish("m1", b"nobody listens")  # not an error


async def test_lagging_subscriber_is_dropped(make_store: StoreFactory) -> None:
    """A listener that stops reading is dropped with SubscriberLagged; others keep going."""
    store = make_store(subscriber_queue=8)
    async with store.subscribe("m1") as fast, store.subscribe("m1") as slow:
        for i in range(20):
            await store.publish("m1", b"%d" % i)
            assert await next_event(fast) == b"%d" % i
        with pytest.raises(SubscriberLagged):
            await next_event(slow)
        await store.publish("m1", b"still here")
        assert await next_event(fast) == b"still here"


async def test_cancellation_never_mixes_meetings(store: Store) -> None:
    """Cancelling store calls at random points, many times, leaves every meeting with only
    its own finals, gap-free, and each source's state agreeing with its last final."""
    rng = random.Random(3)
    meetings = [f"cancel-{i}" for i in range(4)]
    sources: dict[str, list[str]] = {m: [] for m in meetings}
    tokens: dict[str, str] = {}
    seen_reads: list[tuple[str, list[FinalRecord]]] = []

    async def actor(meeting_id: str, participant: str) -> None:
        state, token = await store.create_source(meeting_id, participant)
        sources[meeting_id].append(state.session_id)
        tokens[state.session_id] = token
        for _ in range(3):
            await asyncio.sleep(0)  # an actor awaits audio between finals
            _, state = await emit(store, state, f"{meeting_id} says {state.next_utterance}")

    async def reader(meeting_id: str) -> None:
        seen_reads.append((meeting_id, await store.finals(meeting_id)))

    interrupted = 0
    for round_ in range(100):
        tasks = [asyncio.create_task(actor(m, f"p{round_}")) for m in meetings] + [
            asyncio.create_task(reader(m)) for m in meetings
        ]
        for _ in range(rng.randrange(12)):  # cut in after a random number of loop steps
            await asyncio.sleep(0)
        for task in tasks:
            if rng.random() < 0.5:
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        interrupted += sum(task.cancelled() for task in tasks)

    assert interrupted > 20, interrupted  # the test really cut calls short
    for meeting_id, records in seen_reads:
        assert all(r.text.startswith(meeting_id + " ") for r in records)
    for meeting_id in meetings:
        log = await store.finals(meeting_id)
        assert [r.seq for r in log] == list(range(1, len(log) + 1))
        assert all(r.text.startswith(meeting_id + " ") for r in log)
        assert all(r.session_id in sources[meeting_id] for r in log)
        assert len({r.utterance_id for r in log}) == len(log)
        for session_id in sources[meeting_id]:
            own = [r for r in log if r.session_id == session_id]
            state = await store.resume_source(meeting_id, tokens[session_id])
            assert state.acked_until == (own[-1].end if own else 0.0)
            assert state.next_utterance == len(own)


async def test_health_ok(store: Store) -> None:
    """A reachable store reports ok with no reason."""
    health = await store.health()
    assert health.ok and health.reason == "" and health.buffered == 0
    await store.ping()


async def test_a_source_keeps_its_origin(store: Store, clock: ManualClock) -> None:
    """A source's origin (Unix s, to the ms) is set once, by default from the store's
    clock; a resume keeps it, and its finals carry it."""
    alice, token = await store.create_source("m1", "alice")
    assert alice.origin == round(clock.now, 3)
    bob, _ = await store.create_source("m1", "bob", origin=1_699_999_990.12345)
    assert bob.origin == 1_699_999_990.123
    _, alice = await emit(store, alice)
    clock.advance(600)
    resumed = await store.resume_source("m1", token)
    assert resumed.origin == alice.origin
    await emit(store, bob)
    assert [(f.participant, f.origin) for f in await store.finals("m1")] == [
        ("alice", alice.origin),
        ("bob", bob.origin),
    ]
