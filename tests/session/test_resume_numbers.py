"""A resumed stream's numbers from outside, the client's `resend` and the stored state, are
checked as numbers (issue 44): any bad one is a 1007, never an internal error (sans-I/O)."""

from __future__ import annotations

import base64
import math

import numpy as np
import pytest

from server.limits import RealtimeBudget
from session.resume_context import ResendLead, ResumeContext, resume_context, stored_vad_state
from session.vad import VadState, pack_state, unpack_state
from store.records import FinalRecord, SourceState
from tests.session.test_resume_vad import pipeline
from wire import control
from wire.codes import CloseCode, ErrorCode
from wire.control import parse_resend
from wire.errors import ProtocolError

SESSION = "src-1"


def final(index: int, start: float, end: float) -> FinalRecord:
    return FinalRecord(
        seq=index + 1,
        utterance_id=f"{SESSION}-{index}",
        session_id=SESSION,
        participant="ana",
        text=f"utterance {index}",
        start=start,
        end=end,
        language="en",
    )


def source(acked_until: float, next_utterance: int, vad_state: object = None) -> SourceState:
    return SourceState(
        "m",
        SESSION,
        "ana",
        acked_until=acked_until,
        next_utterance=next_utterance,
        vad_state=vad_state,  # type: ignore[arg-type]  # what a store may hold
    )


def context() -> ResumeContext:
    finals = [final(0, 1.0, 3.0), final(1, 4.0, 6.0)]
    return resume_context(finals, source(6.0, 2), 20.0)


@pytest.mark.parametrize("start", [1e308, -1e308, math.inf, -math.inf, math.nan, 1e20, 7.0])
async def test_a_resend_from_a_number_no_lead_can_hold_closes_1007(start: float) -> None:
    """`resend` from 1e308, ±inf, NaN or past `resume_from`: ProtocolError 1007, not an
    OverflowError (an internal error, 1011)."""
    lead = ResendLead(context())
    with pytest.raises(ProtocolError) as caught:
        lead.resend(start, pipeline(None))  # type: ignore[arg-type]  # refused before use
    assert caught.value.close_code is CloseCode.INVALID_PAYLOAD
    assert caught.value.code is ErrorCode.INVALID_MESSAGE


def test_a_resend_from_a_number_within_the_context_is_accepted() -> None:
    """The bounds themselves are accepted: `send_from` and `resume_from`."""
    ctx = context()
    assert ctx.send_from == 1.0
    assert ctx.lead_samples(1.0) == 5 * 16_000
    assert ctx.lead_samples(6.0) == 0


@pytest.mark.parametrize(
    "text",
    [
        '{"type": "resend", "from": "1"}',
        '{"type": "resend", "from": true}',
        '{"type": "resend", "from": -0.5}',
        '{"type": "resend", "from": null}',
        '{"type": "resend"}',
    ],
)
def test_parse_resend_refuses_what_is_no_second(text: str) -> None:
    """A `from` that is no finite second ≥ 0 is a 1007."""
    with pytest.raises(ProtocolError) as caught:
        parse_resend(text)
    assert caught.value.close_code is CloseCode.INVALID_PAYLOAD


def test_finite_number_takes_only_finite_numbers() -> None:
    """NaN, ±inf, an int too large for a float and a bool are no numbers here."""
    for bad in (math.nan, math.inf, -math.inf, 10**400, True, "1", None):
        assert control.finite_number(bad) is None, bad
    assert control.finite_number(3) == 3.0
    assert control.finite_number(1e308) == 1e308


@pytest.mark.parametrize("stored", [12, 1.5, ["x"], {"state": "x"}, True])
def test_a_stored_vad_state_that_is_not_text_is_absent(stored: object) -> None:
    """A stored VAD state that is not a string: the VAD starts from zero (no TypeError)."""
    assert stored_vad_state(source(6.0, 2, stored)) is None
    with pytest.raises(ValueError):
        unpack_state(stored)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_stored_vad_state_holding_nan_or_inf_is_refused(bad: float) -> None:
    """A packed state with a NaN or an infinity in it is unreadable: the VAD starts from zero
    instead of running on a poisoned recurrent state."""
    good = VadState()
    state = good.state.copy()
    state.ravel()[3] = bad
    packed = pack_state(state, good.context)
    with pytest.raises(ValueError):
        unpack_state(packed)
    assert stored_vad_state(source(6.0, 2, packed)) is None
    clean = pack_state(good.state, good.context)
    assert stored_vad_state(source(6.0, 2, clean)) is not None
    assert np.isfinite(np.frombuffer(base64.b64decode(clean), "<f4")).all()


def test_two_finals_an_hour_apart_keep_no_hour_of_lead() -> None:
    """Finals at 0-2 s and 3,602-3,604 s, resumed at 3,604 s: `send_from` asks for at most
    the context's limit (20 s) of re-sent audio, not the hour between them; a `resend` from
    the first final is refused (1007)."""
    finals = [final(0, 0.0, 2.0), final(1, 3602.0, 3604.0)]
    ctx = resume_context(finals, source(3604.0, 2), 20.0)
    assert 3604.0 - ctx.send_from <= 20.0
    assert [h.index for h in ctx.heard] == [1]
    assert ctx.lead_samples(ctx.send_from) == 2 * 16_000
    with pytest.raises(ProtocolError) as caught:
        ctx.lead_samples(0.0)
    assert caught.value.close_code is CloseCode.INVALID_PAYLOAD


def test_a_lead_within_the_limit_keeps_both_utterances() -> None:
    """Short pauses: both utterances are heard and `send_from` is the first one's start."""
    finals = [final(0, 1.0, 3.0), final(1, 4.0, 6.0)]
    ctx = resume_context(finals, source(6.0, 2), 20.0)
    assert [h.index for h in ctx.heard] == [0, 1] and ctx.send_from == 1.0


def test_a_resend_widens_the_budget_by_its_lead_only() -> None:
    """The real-time budget grows by the lead a `resend` announces (5 s here), and a
    resumed stream that re-sends nothing gets no more than the live burst."""
    told: list[float] = []
    ResendLead(context(), told.append).resend(1.0, pipeline(None))  # type: ignore[arg-type]
    assert told == [5.0]
    told.clear()
    ResendLead(context(), told.append).resend(6.0, pipeline(None))  # type: ignore[arg-type]
    assert told == []

    budget = RealtimeBudget(1.0, 2.0, now=0.0)
    budget.widen(5.0)
    assert budget.spend(7.0, now=0.0) == 0.0  # the lead and the burst at once
    assert budget.spend(1.0, now=0.0) == pytest.approx(1.0)  # then real time


async def test_the_pipeline_keeps_no_copy_of_a_heard_lead() -> None:
    """Once its context is heard, the re-sent lead is the left context's alone: the
    pipeline holds none of it for the rest of the session."""
    stream = pipeline(None)  # type: ignore[arg-type]  # the lead is never scored
    lead = ResendLead(context())
    lead.resend(1.0, stream)
    assert await stream.decode(bytes(5 * 16_000 * 2)) == []  # the whole lead, one frame
    said = lead.heard(stream)
    assert said is not None
    assert said.before(2, 6 * 16_000, 20.0) is not None  # both utterances' context
    assert stream.take_lead().size == 0
