"""Settings of the service: the process, streams and their limits, authentication,
uploads and the store. Each group checks its own fields."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import ClassVar

from server.settings.base import SettingError, at_least, one_of, positive, setting, within
from store.redis.clients import SentinelURL, is_sentinel
from store.redis.scripts import MAX_PREFIX
from wire.query import is_language

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
REDIS_SCHEMES = ("redis://", "rediss://", "unix://", "redis+sentinel://")
MIN_FRAME_BYTES = 1024  # a control message (`start`, `auth`) must fit in a frame


@dataclass(frozen=True, slots=True)
class ServerSettings:
    TITLE: ClassVar[str] = "Server process"

    host: str = setting("127.0.0.1", "Address to listen on (`0.0.0.0` for all interfaces).")
    port: int = setting(8000, "TCP port to listen on (the Procfile passes `$PORT`).")
    static_dir: str = setting(
        "static",
        "Folder of the browser client, served at `/`; a relative one not found in the "
        "working directory is looked for in the installed `server` package, whose "
        "`static/` is the page Parley ships.",
    )
    drain_grace_s: float = setting(
        0.0,
        "On SIGTERM, seconds the node keeps answering (`/readyz` 503 `draining`, new "
        "streams 1013) before it stops listening and drains: time for a balancer's health "
        "check to take it out of rotation.",
    )
    drain_timeout_s: float = setting(
        10.0, "On shutdown, how long sessions get to flush their finals."
    )
    malloc_trim_interval_s: float = setting(
        60.0,
        "Seconds between giving the allocator's free memory back to the OS (glibc "
        "`malloc_trim`: keeps the RSS at what is in use, not the busiest moment's peak); "
        "a model worker process also after 5 s without a batch; 0 = never.",
    )
    malloc_mmap_threshold_kb: int = setting(
        128,
        "Blocks of this many KiB or more get a mapping of their own, returned to the OS when "
        "freed (glibc `mallopt(M_MMAP_THRESHOLD)`, server process): keeps large short-lived "
        "buffers from fragmenting the heap; 0 = glibc's threshold, which rises with use.",
    )
    log_level: str = setting("info", "`debug`, `info`, `warning` or `error`.")
    log_format: str = setting("json", "`json` (one object per line) or `text`.")

    def __post_init__(self) -> None:
        if not self.host:
            raise SettingError("host", self.host, "must be an address or host name")
        within(self, "port", 0, 65535)
        at_least(self, "drain_timeout_s", 0)
        at_least(self, "drain_grace_s", 0)
        at_least(self, "malloc_trim_interval_s", 0, " (0: never)")
        within(self, "malloc_mmap_threshold_kb", 0, 32 * 1024)
        if self.log_level.lower() not in LOG_LEVELS:
            raise SettingError(
                "log_level", self.log_level, "must be one of " + ", ".join(LOG_LEVELS)
            )
        one_of(self, "log_format", ("json", "text"))


@dataclass(frozen=True, slots=True)
class StreamSettings:
    TITLE: ClassVar[str] = "Streams and their limits"

    default_language: str = setting("en", "Language of a stream that does not say.")
    max_frame_bytes: int = setting(1 << 20, "Largest binary or text frame a client may send.")
    max_channels: int = setting(
        8,
        "Most interleaved channels one stream may carry (`channels`, Deepgram's `multichannel`) "
        "or one upload may be split into; each is a source of its own. More: 4400 / HTTP 400.",
    )
    max_sessions: int = setting(
        64,
        "Concurrent audio streams admitted; more get close 1013, and `/readyz` says 503 "
        "(`at capacity`) while the node is full.",
    )
    resume_headroom: float = setting(
        0.1,
        "Resumed streams are admitted past `MAX_SESSIONS` by this share of it (at least 1), "
        "so the streams of a node that died land on the survivors; past that they get 1013 "
        "and retry through the balancer.",
    )
    admit_max_queue_wait_ms: float = setting(
        3000.0,
        "New streams get close 1013 while finals waited longer than this for the model "
        "(median of the last 10 s, 4 finals or more), or a full batch of finals is queued; "
        "0: off.",
    )
    max_streams_per_key: int = setting(
        16,
        "Concurrent audio streams per tenant (authenticated only), across every node "
        "sharing the Redis store; more get close 4429.",
    )
    max_listeners_per_meeting: int = setting(
        64, "Listener sockets per meeting, across every node; more get close 4429."
    )
    max_listeners_per_tenant: int = setting(
        256,
        "Listener sockets per tenant (authenticated only), across every node; more get close 4429.",
    )
    max_listeners: int = setting(2048, "Listener sockets on this node in all; more get close 1013.")
    idle_timeout_s: float = setting(
        30.0, "A stream that sends no audio and no keepalive for this long is closed 4408."
    )
    max_session_s: float = setting(
        4 * 3600.0, "Longest a stream may last; then its finals are flushed and it closes 4413."
    )
    ws_ping_interval_s: float = setting(
        20.0,
        "Seconds between WebSocket pings to a peer; one that has not answered within "
        "WS_PING_TIMEOUT_S is dropped (a half-open connection).",
    )
    ws_ping_timeout_s: float = setting(20.0, "How long a WebSocket ping may go unanswered.")
    realtime_factor: float = setting(
        1.5,
        "Fastest a stream is read, in audio seconds per wall second, unless its tenant is "
        "in FAST_REPLAY_TENANTS (authentication off: no limit).",
    )
    realtime_burst_s: float = setting(
        30.0, "Audio seconds a stream may send ahead of REALTIME_FACTOR (catch-up, resume)."
    )
    listener_send_timeout_s: float = setting(
        10.0, "A listener that takes no message for this long is dropped (close 1008)."
    )
    outbox_limit: int = setting(
        1000, "Undelivered messages to a client before it is dropped as too slow."
    )

    def __post_init__(self) -> None:
        if not is_language(self.default_language):
            raise SettingError(
                "default_language",
                self.default_language,
                "must be an ISO 639-1 code such as 'en', or 'auto'",
            )
        at_least(self, "max_frame_bytes", MIN_FRAME_BYTES)
        for name in (
            "max_channels",
            "max_sessions",
            "max_streams_per_key",
            "max_listeners_per_meeting",
            "max_listeners_per_tenant",
            "max_listeners",
            "outbox_limit",
        ):
            at_least(self, name, 1)
        at_least(self, "admit_max_queue_wait_ms", 0, " (0: off)")
        at_least(self, "resume_headroom", 0)
        at_least(self, "realtime_burst_s", 0)
        positive(
            self,
            "idle_timeout_s",
            "max_session_s",
            "ws_ping_interval_s",
            "ws_ping_timeout_s",
            "realtime_factor",
            "listener_send_timeout_s",
        )


@dataclass(frozen=True, slots=True)
class AuthSettings:
    TITLE: ClassVar[str] = "Authentication"

    api_keys: str | None = setting(
        None,
        "API keys as `tenant:key` pairs, comma separated (keys of 16+ characters). Setting "
        "any key (here or in API_KEYS_FILE) turns authentication on.",
        secret=True,
    )
    api_keys_file: str | None = setting(
        None, "File of API keys, one `tenant:key` per line (`#` comments)."
    )
    fast_replay_tenants: str = setting(
        "", "Tenants whose streams may exceed REALTIME_FACTOR, comma separated; `*`: all."
    )
    allowed_origins: str | None = setting(
        None,
        "Origins of browser pages that may open WebSockets and send state-changing requests "
        "(POST, DELETE; others get 403 / 4403 `forbidden`), comma separated "
        "(`https://app.example`); `*`: any. Unset: this server's own origin; while "
        "authentication is off, also pages on loopback hosts (`localhost`, `127.0.0.1`), "
        "and the own origin only by IP, `localhost` or an ALLOWED_HOSTS name.",
    )
    allowed_hosts: str = setting(
        "",
        "Host names a protected-mode server answers besides its loopback ones (`localhost`, "
        "`*.localhost`, 127.0.0.0/8, `[::1]`), comma separated (`devbox`); `*`: any. Any "
        "other `Host` is refused 403 / 4403 `host_not_allowed` (a defence against DNS "
        "rebinding); its page's own origin by a listed name is allowed too.",
    )
    protected_mode: bool = setting(
        True,
        "While no API key is configured, serve meetings (streams, listeners, transcripts, "
        "uploads, tokens, the compat sockets) to loopback clients only; others get 403 / "
        "close 4403 `protected_mode`. `off`: serve anyone anonymously, on purpose. "
        "`/healthz`, `/readyz` and `/metrics` are open either way.",
    )
    trusted_proxies: str = setting(
        "127.0.0.0/8,::1",
        "Proxies (IP addresses or CIDRs, comma separated) whose `X-Forwarded-For` names the "
        "client: the address protected mode and uploads judge (a forwarded address is never "
        "loopback). List only the proxies themselves (in Kubernetes: the ingress "
        "controller's pod addresses); from anyone else the header is ignored. Empty: trust "
        "none.",
    )
    token_ttl_s: float = setting(
        60.0, "Lifetime of a meeting token (single use) minted by POST /v1/meetings/{id}/tokens."
    )
    auth_timeout_s: float = setting(
        10.0, "A socket that has not authenticated within this many seconds is closed 4401."
    )
    max_tokens_per_tenant: int = setting(
        1000,
        "Unspent, unexpired meeting tokens one tenant may hold; minting more answers 429.",
    )
    max_waiting_auth: int = setting(
        256,
        "Sockets that came without credentials and wait for their `auth` message, in all; "
        "more get close 1013.",
    )

    def __post_init__(self) -> None:
        positive(self, "token_ttl_s", "auth_timeout_s")
        for item in filter(None, (part.strip() for part in self.trusted_proxies.split(","))):
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:  # uvicorn would take a typo, or `*`, silently
                raise SettingError(
                    "trusted_proxies", self.trusted_proxies, f"{item!r} is not an IP or CIDR"
                ) from None
        at_least(self, "max_tokens_per_tenant", 1)
        at_least(self, "max_waiting_auth", 1)


@dataclass(frozen=True, slots=True)
class UploadSettings:
    TITLE: ClassVar[str] = "Uploads (POST /v1/transcriptions)"

    max_upload_bytes: int = setting(
        100 << 20, "Largest audio file `POST /v1/transcriptions` accepts (counted as it streams)."
    )
    max_upload_seconds: float = setting(
        14_400.0, "Longest decoded duration of an uploaded file (4 h); longer files get 422."
    )
    upload_dir: str | None = setting(
        None, "Folder for uploads and their decoded audio while a job runs; unset: system temp."
    )
    upload_idle_timeout_s: float = setting(
        30.0, "An upload whose body sends nothing for this long is refused (408)."
    )
    upload_receive_timeout_s: float = setting(
        3600.0,
        "Longest an upload's body may take to arrive (408 after): a slow client holds a job "
        "slot at most this long.",
    )
    upload_decode_timeout_s: float = setting(
        300.0, "Wall-clock limit of one upload's decoder subprocess."
    )
    upload_decode_cpu_s: int = setting(
        180, "CPU-time limit (RLIMIT_CPU) of the decoder subprocess."
    )
    upload_decode_memory_mb: int = setting(
        512, "Address-space limit (RLIMIT_AS) of the decoder subprocess, in MiB."
    )
    upload_decoders: int = setting(1, "Decoder subprocesses running at once; more uploads wait.")
    upload_sandbox: str = setting(
        "auto",
        "Sandbox of the upload decoder: `bwrap` (bubblewrap: no network, none of the host's "
        "files; the server refuses to start without it), `auto` (bubblewrap when it works "
        "here; else unconfined for loopback clients only, and remote uploads and "
        "enrollments are refused with 503 `sandbox_unavailable`), or `off` (unconfined for "
        "every client, on purpose; `none` is the same).",
    )
    upload_max_jobs: int = setting(
        16,
        "Unfinished upload jobs at once (more get 503); as many finished ones are kept for "
        "their TTL.",
    )
    upload_job_ttl_s: float = setting(3600.0, "How long a finished job's result stays readable.")
    upload_concurrency: int = setting(1, "Jobs transcribing at once; the others wait as `queued`.")
    upload_in_flight: int = setting(
        8,
        "Recognition requests an upload keeps in the scheduler while no live stream is open "
        "(fills batches: fastest on a GPU).",
    )
    upload_in_flight_live: int = setting(
        1,
        "The same while live streams are open: a live final then waits at most for a "
        "batch with this many file utterances.",
    )
    upload_live_share: float = setting(
        0.5,
        "Share of the model's time an upload may take while live streams are open; it "
        "idles the rest so live finals find the model free (1 = no pause).",
    )
    upload_wait_s: float = setting(
        300.0, "How long `POST …?wait=true` holds the response before answering 202 instead."
    )
    job_sync_s: float = setting(
        1.0,
        "How often a node writes its unfinished upload jobs' progress to the store (other "
        "nodes read it) and picks up cancels asked through other nodes.",
    )

    def __post_init__(self) -> None:
        for name in (
            "max_upload_bytes",
            "upload_decoders",
            "upload_max_jobs",
            "upload_concurrency",
            "upload_in_flight",
            "upload_in_flight_live",
        ):
            at_least(self, name, 1)
        positive(
            self,
            "max_upload_seconds",
            "upload_idle_timeout_s",
            "upload_receive_timeout_s",
            "upload_decode_timeout_s",
            "upload_decode_cpu_s",
            "upload_job_ttl_s",
            "job_sync_s",
        )
        # the decoder itself needs ~150 MiB to start
        at_least(self, "upload_decode_memory_mb", 256)
        one_of(self, "upload_sandbox", ("auto", "bwrap", "off", "none"))
        within(self, "upload_live_share", 0.05, 1)
        at_least(self, "upload_wait_s", 0)


@dataclass(frozen=True, slots=True)
class StoreSettings:
    TITLE: ClassVar[str] = "Meeting store"

    redis_url: str | None = setting(
        None,
        "Redis URL for meeting context (e.g. `redis://127.0.0.1:6379/0`), or the sentinels "
        "naming the primary (`redis+sentinel://host:26379,host2:26379/mymaster/0`, "
        "docs/store.md#sentinel-failover-to-a-replica); unset: in-process.",
    )
    store_prefix: str = setting("parley:", "Prefix of every Redis key.")
    meeting_ttl_s: float = setting(
        24 * 3600.0,
        "How long a meeting's transcript is kept after a write, before it grows with reads "
        "(up to 2x) and decays with idleness (docs/store.md).",
    )
    node_lease_s: float = setting(
        10.0,
        "With Redis: how long a node's quota slots and its unfinished upload jobs outlive "
        "it. A live node renews its lease every third of this; when it dies, its slots "
        "free and its jobs read as failed (`node_lost`) this long after.",
    )

    def __post_init__(self) -> None:
        url = self.redis_url
        if url is not None and not url.startswith(REDIS_SCHEMES):
            shown = "…@" + url.rpartition("@")[2] if "@" in url else url  # not a password
            raise SettingError("redis_url", shown, "must start with " + ", ".join(REDIS_SCHEMES))
        if url is not None and is_sentinel(url):
            try:
                SentinelURL.parse(url)
            except ValueError as exc:
                shown = "…@" + url.rpartition("@")[2] if "@" in url else url
                raise SettingError("redis_url", shown, str(exc)) from None
        prefix = self.store_prefix
        if not 1 <= len(prefix) <= MAX_PREFIX or any(c.isspace() for c in prefix):
            raise SettingError(
                "store_prefix", prefix, f"must be 1-{MAX_PREFIX} characters without spaces"
            )
        positive(self, "meeting_ttl_s", "node_lease_s")
