"""The load-adaptive partial policy."""

from __future__ import annotations

import pytest

from session.partials import PartialPolicy, PartialPolicyConfig


def admitted(
    policy: PartialPolicy, load: float, ends: list[float], utterance: int = 0
) -> list[float]:
    return [end for end in ends if policy.admit(utterance, end, load)]


def test_idle_admits_every_proposal() -> None:
    """With an empty queue every partial the segmenter proposes goes through."""
    policy = PartialPolicy(PartialPolicyConfig(interval=0.8))
    assert admitted(policy, 0.0, [0.8, 1.6, 2.4, 3.2]) == [0.8, 1.6, 2.4, 3.2]


def test_interval_stretches_with_load_past_the_knee() -> None:
    """Below the knee every proposal passes; at load knee + 0.25 with stretch 4 the
    interval doubles: every other proposal passes."""
    config = PartialPolicyConfig(interval=0.8, stretch=4.0, knee=0.5, max_load=2.0)
    assert admitted(PartialPolicy(config), 0.5, [0.8, 1.6, 2.4]) == [0.8, 1.6, 2.4]
    assert admitted(PartialPolicy(config), 0.75, [0.8, 1.6, 2.4, 3.2, 4.0]) == [0.8, 2.4, 4.0]


def test_overload_stops_partials_and_a_new_utterance_restarts_them() -> None:
    """Past max_load nothing passes; the first partial of a new utterance passes at once."""
    policy = PartialPolicy(PartialPolicyConfig(interval=0.8, max_load=2.0))
    assert admitted(policy, 3.0, [0.8, 1.6]) == []
    assert admitted(policy, 1.0, [10.0, 10.8], utterance=1) == [10.0]


def test_config_is_validated() -> None:
    """A non-positive interval is refused."""
    with pytest.raises(ValueError):
        PartialPolicyConfig(interval=0)
