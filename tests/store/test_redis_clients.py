"""`redis+sentinel://` URLs: what they name, and what the settings refuse."""

from __future__ import annotations

import pytest

from server.settings import Settings
from server.settings.base import SettingError
from store.redis.clients import SENTINEL_PORT, SentinelURL


def test_sentinel_url_names_sentinels_service_db_and_passwords() -> None:
    url = SentinelURL.parse(
        "redis+sentinel://:s%40cret@10.0.0.1:26380,sentinel-b,[::1]:26381/mymaster/2"
        "?sentinel_password=guard"
    )
    assert url.sentinels == (("10.0.0.1", 26380), ("sentinel-b", SENTINEL_PORT), ("::1", 26381))
    assert (url.service, url.db) == ("mymaster", 2)
    assert (url.username, url.password, url.sentinel_password) == (None, "s@cret", "guard")


def test_sentinel_url_db_defaults_to_zero() -> None:
    url = SentinelURL.parse("redis+sentinel://127.0.0.1:26379/parley")
    assert (url.service, url.db, url.password) == ("parley", 0, None)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("redis+sentinel:///parley/0", "names no sentinel"),
        ("redis+sentinel://h:26379", "path must be"),
        ("redis+sentinel://h:26379/parley/zero", "not a number"),
        ("redis+sentinel://h:port/parley", "port that is not a number"),
        ("redis+sentinel://h/parley?ssl=true", "unknown option 'ssl'"),
    ],
)
def test_settings_refuse_a_malformed_sentinel_url(url: str, reason: str) -> None:
    with pytest.raises(SettingError, match=reason):
        Settings.from_env({"PARLEY_REDIS_URL": url})
