"""The meeting store: config, audio sources (for resume), the finals log with its
gap-free `seq`, and live event fan-out; and what several nodes share: quota slots as
leases, upload job records, takeover announcements. docs/store.md describes keys, TTLs
and faults.

- `store.api`            the `Store` interface the sessions and routes use
- `store.errors`         what it raises on purpose
- `store.records`        what it keeps: finals, source state, health
- `store.ttl`            how long a meeting lives: a decaying, activity-aware TTL
- `store.listener`       one listener's bounded event queue
- `store.memory`         `MemoryStore`: the embedded single-node default (its quotas,
                         jobs and takeovers in `memory_cluster`: this node's only)
- `store.redis.store`    `RedisStore`: the same semantics across processes, built from
                         `redis_scripts` (keys, Lua), `redis_buffer` (writes held while
                         Redis is away), `redis_events` (pub/sub, takeovers), `redis_link`
                         (is Redis there), `redis_speakers` (relabelled speakers),
                         `redis_leases` (node heartbeat, quota leases), `redis_jobs`
                         (upload job records), `keyed_locks`, `redis_clients`
                         (a client from a URL: one server, or Sentinel's primary)
- `store.factory`        `open_store()`: the store the settings ask for

store imports only `wire` of the project.
"""
