"""What the store raises on purpose (what the server does with it in brackets):

StoreError
├── StoreUnavailable         the store cannot be reached and this call cannot be
│                            buffered (new session: 1013; transcript GET: 503)
├── StoreOverloaded          the write buffer is at its bound (new session: 1013;
│                            an append: end the session with 1013, the client resumes)
├── SourceSuperseded         the source was resumed by another session: stop this one
├── ResumeRefused
│   ├── UnknownResumeToken   no such token: expired or never issued (4404)
│   └── ResumeTokenMismatch  the token belongs to another meeting or participant (4403)
└── SubscriberLagged         a listener was dropped; it reconnects and catches up
    └── SubscriptionLost     ... because the store connection under it broke or closed
QuotaFull                    a quota's slots are all held (4429 or 1013, by quota)
"""

from __future__ import annotations


class StoreError(Exception):
    """Base of every error the store raises on purpose."""


class StoreUnavailable(StoreError):
    """The store cannot be reached and the call cannot be served from the write buffer."""


class StoreOverloaded(StoreError):
    """The write buffer is full (or too full to admit a new session)."""


class SourceSuperseded(StoreError):
    """Another session resumed this source; appends from the older one are refused."""


class ResumeRefused(StoreError):
    """A resume token that cannot resume this source."""


class UnknownResumeToken(ResumeRefused):
    """No such token in this meeting: never issued, malformed, or expired with its meeting."""


class ResumeTokenMismatch(ResumeRefused):
    """The token is bound to another meeting or another participant."""


class SubscriberLagged(StoreError):
    """A listener fell more than SUBSCRIBER_QUEUE events behind and was dropped."""


class SubscriptionLost(SubscriberLagged):
    """The store connection under a listener broke (or the store closed): events may be
    missing, so the listener is dropped like a lagging one."""


class QuotaFull(Exception):
    """Every slot of a quota is held (not a store fault: the caller refuses). `name`,
    `key` and `limit` are the full claim's (store.api.QuotaClaim)."""

    def __init__(self, name: str, key: str, limit: int) -> None:
        super().__init__(f"quota {name} of {key!r} is full ({limit})")
        self.name = name
        self.key = key
        self.limit = limit
