"""`python -m bench.nodes`: a node SIGKILLed under live rooms, behind the balancer.

The deployment of `python -m deploy.local` (Redis with Sentinel, N nodes with API keys,
HAProxy with health checks on /readyz) carries R rooms of corpus speech streamed through
HAProxy by resuming clients (bench/chaos.py's: each keeps its audio, resumes with its
token and last `seq`, re-sends from `resume_from`). After `--kill-at` seconds the node
serving the most streams is SIGKILLed. Each room's log (`GET …/transcript` through the
balancer) is then audited against the same audio streamed once before without faults:

- **lost**: a baseline utterance no logged final covers, or a logged final its client
  never received; **duplicated**: an utterance id logged twice, or two logged finals over
  the same audio;
- **resumed**: each stream whose socket the kill cut has a later socket that started
  (on a survivor: the killed node is gone);
- **the blip**: how long those streams took from the kill to their resumed
  `session.started`, and final latency (arrival minus when the final's last audio was
  first sent) before the kill, for the cut streams' finals whose audio was sent in the
  10 s after it, and after that (cut streams apart). A client sends audio at the pace
  it was spoken and, on resuming, its backlog at once (`Stream(spoken_pace=True)`).

The nodes run the stand-in engine by default (bench/fake_server.py: the model's time
simulated, everything else real), since three real models do not fit a 2-core box;
`--engine model` runs `python -m server`.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import http.client
import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.chaos import Stream, audit, speech
from deploy.local import Deployment, Node

BLIP_WINDOW_S = 10.0  # finals whose audio was sent this long after the kill


def transcript(deployment: Deployment, meeting: str) -> list[dict[str, Any]]:
    """The meeting's log, through the balancer, with the deployment's API key."""
    conn = http.client.HTTPConnection("127.0.0.1", deployment.port, timeout=10)
    try:
        conn.request(
            "GET",
            f"/v1/meetings/{meeting}/transcript?format=json",
            headers={"Authorization": f"Bearer {deployment.key}"},
        )
        response = conn.getresponse()
        body = response.read()
    finally:
        conn.close()
    if response.status != 200:
        raise RuntimeError(f"transcript of {meeting}: HTTP {response.status} {body[:200]!r}")
    finals: list[dict[str, Any]] = json.loads(body)["finals"]
    return finals


def latency(stream: Stream, final: dict[str, Any]) -> tuple[float, float] | None:
    """(when the final's last audio was first sent, how long until the final arrived)."""
    arrived = stream.arrived.get(final["utterance_id"])
    end_byte = int(final["end"] * 16_000) * 2
    ends = [end for end, _ in stream.sent]
    i = bisect.bisect_left(ends, end_byte)  # the first frame that reached the final's end
    if arrived is None or i >= len(stream.sent):
        return None
    sent = min(at for end, at in stream.sent[i:] if end >= end_byte)
    return sent, arrived - sent


def quantiles(values: list[float]) -> dict[str, float | int]:
    if not values:
        return {"n": 0}
    q = np.percentile(values, [50, 95, 100])
    return {"n": len(values), "p50": round(q[0], 3), "p95": round(q[1], 3), "max": round(q[2], 3)}


async def kill_busiest(deployment: Deployment, at: float) -> tuple[Node, float, int]:
    await asyncio.sleep(at)
    alive = [n for n in deployment.nodes if n.alive]
    counts = await asyncio.gather(*(asyncio.to_thread(n.active_sessions) for n in alive))
    node, count = max(zip(alive, counts, strict=True), key=lambda nc: nc[1])
    killed_at = time.monotonic()
    node.end(signal.SIGKILL)
    print(f"  killed {node.name} with {count} streams (streams per node: {counts})", flush=True)
    return node, killed_at, count


async def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="parley-nodes-"))
    module = "bench.fake_server" if args.engine == "fake" else "server"
    env = {
        "PARLEY_LOG_LEVEL": "warning",
        "PARLEY_UPLOAD_SANDBOX": "none",
        "PARLEY_ADMIT_MAX_QUEUE_WAIT_MS": "0",
        "PARLEY_MAX_STREAMS_PER_KEY": str(4 * args.rooms),
        "PARLEY_PARTIAL_INTERVAL_S": "0.8",
    }
    deployment = Deployment(work, nodes=args.nodes, module=module, env=env)
    print(f"nodes: {args.nodes} nodes ({args.engine}), {args.rooms} rooms of {args.seconds} s; "
          f"kill at {args.kill_at} s; logs in {work}", flush=True)  # fmt: skip
    await asyncio.to_thread(deployment.start)
    auth = {"Authorization": f"Bearer {deployment.key}"}
    audio = [speech(args.seed * 100 + i, args.seconds) for i in range(args.rooms)]
    try:
        baseline = [
            Stream(i, deployment, pcm, speed=0.0, meeting=f"base-{i}", headers=auth)
            for i, pcm in enumerate(audio)
        ]
        await asyncio.gather(*(s.run() for s in baseline))
        expected = [transcript(deployment, s.meeting) for s in baseline]
        streams = [
            Stream(i, deployment, pcm, 1.0, meeting=f"room-{i}", headers=auth, spoken_pace=True)
            for i, pcm in enumerate(audio)
        ]
        running = [asyncio.create_task(s.run()) for s in streams]
        node, killed_at, on_node = await kill_busiest(deployment, args.kill_at)
        await asyncio.wait_for(asyncio.gather(*running), args.seconds * 4 + 120)
        audits = [
            audit(s, transcript(deployment, s.meeting), e)
            for s, e in zip(streams, expected, strict=True)
        ]
    finally:
        await asyncio.to_thread(deployment.stop)
    return summarize(args, streams, audits, killed_at, on_node, node.name, work)


def summarize(
    args: argparse.Namespace,
    streams: list[Stream],
    audits: list[dict[str, int]],
    killed_at: float,
    on_node: int,
    node: str,
    work: Path,
) -> dict[str, Any]:
    # no other fault strikes: a stream that had to start a second socket was cut by the kill
    cut = [s for s in streams if sum(k.started_at is not None for k in s.sockets) > 1]
    resume_s = [
        min(k.started_at for k in s.sockets if k.started_at and k.started_at > killed_at)
        - killed_at
        for s in cut
    ]
    phases: dict[str, list[float]] = {"before": [], "blip": [], "after": [], "after_cut": []}
    blip_streams = {id(s) for s in cut}
    for stream in streams:
        for final in stream.finals.values():
            timed = latency(stream, final)
            if timed is None:
                continue
            sent, took = timed
            was_cut = id(stream) in blip_streams
            if sent + took < killed_at:
                phases["before"].append(took)
            elif was_cut and sent < killed_at + BLIP_WINDOW_S:
                phases["blip"].append(took)
            else:
                phases["after_cut" if was_cut else "after"].append(took)
    total = {k: sum(a[k] for a in audits) for k in audits[0]}
    return {
        "command": "python -m bench.nodes " + " ".join(sys.argv[1:]),
        "nodes": args.nodes,
        "engine": args.engine,
        "rooms": args.rooms,
        "seconds": args.seconds,
        "killed": node,
        "streams_on_killed_node": on_node,
        "streams_cut": len(cut),
        "streams_resumed": sum(s.ended is not None for s in cut),
        "streams_ended": sum(s.ended is not None for s in streams),
        "finals": total,
        "resume_s": quantiles(resume_s),
        "final_latency_s": {k: quantiles(v) for k, v in phases.items()},
        "logs": str(work),
    }


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.nodes", description=__doc__)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--rooms", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=40.0, help="audio per room")
    parser.add_argument("--kill-at", type=float, default=15.0, help="seconds into the rooms")
    parser.add_argument("--engine", choices=("fake", "model"), default="fake")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=2))
    finals = result["finals"]
    ok = finals["lost"] == 0 and finals["duplicated"] == 0
    ok = ok and result["streams_resumed"] == result["streams_cut"] > 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
