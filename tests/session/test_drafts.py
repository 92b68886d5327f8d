"""A session hands each request of an utterance the text of that utterance's latest partial
as the recognizer's decoding draft (engine/whisper/greedy.py checks drafts; they never change
text)."""

from __future__ import annotations

from bench.fake_recognizer import FakeRecognizer
from tests.support.appserver import serve_app
from tests.support.corpus import clip
from tests.support.wsclient import stream_pcm


async def test_partials_and_finals_carry_the_latest_partial_as_draft() -> None:
    """JFK at 4x: the first request of each utterance has no draft; every later one has
    the text of a partial of the same utterance (the fake writes 'n=<samples>', so the
    draft names a shorter prefix of the same audio); the first partial of the next
    utterance starts without one again."""
    fake = FakeRecognizer()
    async with serve_app(lambda s: fake, partial_interval_s=0.5) as server:
        result = await stream_pcm(
            server.ws_url, "drafts", clip("en_jfk").pcm16(), speed=4, trailing_silence=1.0
        )
        merged = (
            server.state.metrics.registry.get_sample_value(
                "parley_partials_dropped_total", {"reason": "merged"}
            )
            or 0.0
        )  # no sample: none merged
    partials = result.of_type("transcript.partial")
    assert result.finals and partials
    drafted = [(n, draft) for n, draft in fake.drafts if draft]
    assert drafted, fake.drafts
    for n, draft in drafted:
        assert draft.startswith("n=")
        assert int(draft[2:]) < n  # an earlier, shorter look at the same utterance
    # The final of each utterance follows its own partials: its draft is the last one sent.
    # Unless the client's outbox replaced an unsent partial with a newer one ('merged', by
    # design, when the writer is behind: a loaded machine): then a draft may be a partial
    # the client never saw, and it is at least one the recognizer computed.
    sent = {p["text"] for p in partials}
    computed = {f"n={n}" for n, _ in fake.drafts}
    assert {draft for _, draft in drafted} <= (sent if merged == 0 else computed), merged
    assert fake.drafts[0][1] == ""
    assert len(fake.drafts) > len(drafted)  # utterance starts have none
