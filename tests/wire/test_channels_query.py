"""A stream's `channels` and its channels' participants (wire/query.py)."""

from __future__ import annotations

import pytest

from wire.codes import CloseCode
from wire.errors import ProtocolError
from wire.query import channel_participants, parse_channels


def test_channels_default_to_one_and_stop_at_the_limit() -> None:
    """Absent: 1; 1..limit taken; 0, past the limit or not a number: 4400."""
    assert parse_channels(None, 8) == 1
    assert parse_channels("8", 8) == 8
    for raw in ("0", "9", "two", "-1", "2.0"):
        with pytest.raises(ProtocolError) as refused:
            parse_channels(raw, 8)
        assert refused.value.close_code == CloseCode.BAD_REQUEST


def test_participants_are_named_or_numbered_by_channel() -> None:
    """`ana,bo` names two channels; one name is numbered by channel index; one channel
    keeps its name as it is."""
    assert channel_participants("ana,bo", 2) == ("ana", "bo")
    assert channel_participants("desk", 3) == ("desk-0", "desk-1", "desk-2")
    assert channel_participants("desk", 1) == ("desk",)


@pytest.mark.parametrize(
    ("raw", "channels"), [("a,b,c", 2), ("a,a", 2), ("a,", 2), ("a,b", 1), ("../x", 2)]
)
def test_participants_that_do_not_fit_are_refused(raw: str, channels: int) -> None:
    """Too many or too few names, a repeated one, or a name that is no id: 4400."""
    with pytest.raises(ProtocolError) as refused:
        channel_participants(raw, channels)
    assert refused.value.close_code == CloseCode.BAD_REQUEST
