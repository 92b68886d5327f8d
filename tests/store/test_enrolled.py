"""Enrolled speakers in both stores: kept per tenant, bounded, names unique, deletable."""

from __future__ import annotations

import numpy as np
import pytest

from store.api import Store
from store.enrolled import EnrolledSpeaker, SpeakerBookFull, SpeakerNameTaken


def speaker(speaker_id: str, name: str, created_at: float = 1.0) -> EnrolledSpeaker:
    vector = np.random.default_rng(len(speaker_id)).random(256).astype("<f4")
    return EnrolledSpeaker(speaker_id, name, created_at, 5.0, vector.tobytes())


async def test_add_list_get_delete(store: Store) -> None:
    """A speaker comes back whole (its embedding too), in creation order, until deleted."""
    alice, bob = speaker("spk_a", "Alice", 1.0), speaker("spk_b", "Bob", 2.0)
    await store.speakers.add("acme", bob, 10)
    await store.speakers.add("acme", alice, 10)
    assert await store.speakers.list("acme") == [alice, bob]
    assert await store.speakers.get("acme", "spk_b") == bob
    assert await store.speakers.delete("acme", "spk_b") is True
    assert await store.speakers.delete("acme", "spk_b") is False
    assert await store.speakers.get("acme", "spk_b") is None
    assert await store.speakers.list("acme") == [alice]


async def test_tenants_never_see_each_other(store: Store) -> None:
    """Another tenant's (and the anonymous book's) speakers are invisible and undeletable."""
    await store.speakers.add("acme", speaker("spk_a", "Alice"), 10)
    await store.speakers.add("globex", speaker("spk_g", "Alice"), 10)  # same name: its own book
    assert [s.speaker_id for s in await store.speakers.list("globex")] == ["spk_g"]
    assert await store.speakers.get("globex", "spk_a") is None
    assert await store.speakers.delete("globex", "spk_a") is False
    assert await store.speakers.list(None) == []
    assert await store.speakers.get("acme", "spk_a") is not None


async def test_bound_and_unique_names(store: Store) -> None:
    """The book refuses past its limit and a name taken in any case; a delete frees both."""
    await store.speakers.add("acme", speaker("spk_a", "Alice"), 2)
    with pytest.raises(SpeakerNameTaken):
        await store.speakers.add("acme", speaker("spk_x", "ALICE"), 2)
    await store.speakers.add("acme", speaker("spk_b", "Bob"), 2)
    with pytest.raises(SpeakerBookFull):
        await store.speakers.add("acme", speaker("spk_c", "Carol"), 2)
    assert await store.speakers.delete("acme", "spk_a")
    await store.speakers.add("acme", speaker("spk_d", "alice"), 2)
    assert {s.name for s in await store.speakers.list("acme")} == {"Bob", "alice"}
