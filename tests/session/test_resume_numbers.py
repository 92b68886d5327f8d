"""A resumed stream's numbers from outside, the client's `resend` and the stored state, are
checked as numbers (issue 44): any bad one is a 1007, never an internal error (sans-I/O)."""

from __future__ import annotations

import base64
import math

import numpy as np
import pytest

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
