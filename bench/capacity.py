"""Capacity benchmark: one server configuration, real-time rooms of corpus speech, one table.

    python -m bench.capacity --rooms 4,8,16 --duration 60                  # partials on
    python -m bench.capacity --rooms 4,8,16 --interim both PARLEY_MAX_BATCH_SIZE=1
    python -m bench.capacity --find-max-rooms --rooms 2 --max-rooms 32     # double, bisect
    python -m bench.capacity --stand-in --rooms 48 PARLEY_MODEL_WORKERS=1 \
        PARLEY_FAKE_BATCH_TABLE=1:138,2:109,4:104,8:121,16:134,32:195,64:353  # a GPU's costs

Each KEY=VALUE argument is a server environment variable, so one command measures one
configuration. The command starts `python -m server` with them (`--stand-in`:
`bench.fake_server`, the same server with a stand-in model of set batch times, for the
front end's cost and the policy on a GPU's costs; its WER means nothing), then runs the load
generator (`loadgen.run`) against it: at each listed room count (with partials on, off
or both: `--interim`), or as a search for the most rooms within the SLO. Every run gets
one row:

- rooms, partials on/off, pass/fail against the SLO (P95, lost finals, growing lag);
- final latency P50/P95/P99 (client-side: docs/protocol.md#server--client), WER, lost finals;
- partial cadence: median time to an utterance's first partial, and partials per 2 s of
  speech (the worst room, and the median room);
- the finals' queue wait P50/P95 (the server's own `timing.queue`), where the rest of a
  final's latency goes: the median time until the server closed the utterance (latency −
  `timing.total`: the endpoint's silence, VAD, transport), the median batch inference
  (`timing.inference`), and close → sent P50/P95 (`timing.total`);
- model utilization: model-busy seconds over wall seconds per worker (`/metrics`:
  `parley_model_seconds_total`, or `parley_inference_seconds_sum` on older servers), and
  the share of it spent on partials; the batch sizes' P50/P95 (every batch, partials and
  finals, as `parley_batch_size`'s bucket bounds) and mean;
- speculative finals by outcome (`parley_speculative_finals_total`): used by their final,
  discarded after the model started on them (wasted model time), cancelled while queued;
- server CPU in cores (the server process and its children, from /proc), and of it the
  main thread's (the event loop: sockets, sessions, VAD), and the VAD's mean windows per
  model call (`parley_vad_windows_total` / `parley_vad_calls_total`);
- the whole machine's idle and steal shares of its CPU time during the run (/proc/stat):
  on a shared VM, steal is time the hypervisor gave to others, and a run with much of it
  measures less than the machine can do.

Rows go to stdout as a markdown table and to `REPORT_DIR/capacity.json`; each run's
loadgen report lands beside it. Run it on an otherwise idle machine (`flock -x
/tmp/parley-cpu.lock` on the shared dev box): the server and the load generator share it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from bench.processes import free_port
from loadgen.corpus import default_corpus_dir
from loadgen.report import Limits
from loadgen.run import (
    LoadSettings,
    SearchSettings,
    find_max_rooms,
    prepare_corpus,
    run_load,
    write_report,
)
from server.engine_plan import describe_plan, plan_engine
from server.settings import Settings

REPO = Path(__file__).resolve().parent.parent


def wait_ready(url: str, process: subprocess.Popen[bytes], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"server exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit("server not ready in time")


# ---------------------------------------------------------------------- server probe


def _process_tree(root: int) -> list[int]:
    """`root` and every descendant process (model worker processes count as the server)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, frontier = [root], [root]
    while frontier:
        children = [pid for pid, parent in parents.items() if parent in frontier]
        tree += children
        frontier = children
    return tree


def _stat_cpu_seconds(stat: Path) -> float:
    """User + system CPU seconds in a /proc `stat` file (0 if it is gone)."""
    try:
        fields = stat.read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def cpu_seconds(root: int) -> float:
    """User + system CPU seconds of `root` and its live descendants."""
    return sum(_stat_cpu_seconds(Path(f"/proc/{pid}/stat")) for pid in _process_tree(root))


def machine_ticks() -> tuple[int, ...]:
    """The machine's CPU time in clock ticks from /proc/stat's first line: user, nice,
    system, idle, iowait, irq, softirq, steal."""
    return tuple(int(field) for field in Path("/proc/stat").read_text().split()[1:9])


def machine_shares(before: tuple[int, ...], after: tuple[int, ...]) -> dict[str, float | None]:
    """The shares of the machine's CPU time that were idle and stolen (by the hypervisor)
    between two `machine_ticks`: on a shared VM a run with much steal measures less."""
    spent = [b - a for a, b in zip(before, after, strict=True)]
    total = sum(spent)
    if total <= 0:
        return {"machine_idle": None, "machine_steal": None}
    return {"machine_idle": spent[3] / total, "machine_steal": spent[7] / total}


def thread_cpu_seconds(pid: int, tid: int) -> float:
    """User + system CPU seconds of one thread (the main thread: `tid` = `pid`)."""
    return _stat_cpu_seconds(Path(f"/proc/{pid}/task/{tid}/stat"))


def scrape(url: str) -> dict[str, float]:
    """`/metrics` as {'name{labels}': value} (comments dropped)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def _sum(samples: dict[str, float], prefix: str, label: str = "") -> float:
    return sum(v for k, v in samples.items() if k.startswith(prefix) and label in k)


def histogram_quantile(
    before: dict[str, float], after: dict[str, float], name: str, q: float
) -> float | None:
    """The `q` quantile of what histogram `name` observed between two scrapes: the upper
    bound of the first bucket that holds it (None: nothing observed, or past the last)."""
    buckets = sorted(
        (float(key.split('le="')[1].split('"')[0]), value - before.get(key, 0.0))
        for key, value in after.items()
        if key.startswith(f"{name}_bucket{{")
    )
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return None
    for bound, count in buckets:
        if count >= q * total:
            return None if bound == float("inf") else bound
    return None


# session/partial_sender.py's reasons for a partial not sent
PARTIAL_DROP_REASONS = (
    "queue_full",
    "superseded",
    "cancelled",
    "stale",
    "empty",
    "failed",
    "waiting",
)


@dataclass(frozen=True, slots=True)
class Snapshot:
    when: float
    cpu: float
    loop_cpu: float  # the server's main thread: the event loop, VAD and the sessions
    metrics: dict[str, float]
    machine: tuple[int, ...]  # `machine_ticks`


class ServerProbe:
    """CPU and model time of one server between two moments."""

    def __init__(self, url: str, pid: int) -> None:
        self._url = url
        self._pid = pid

    def snapshot(self) -> Snapshot:
        return Snapshot(
            time.monotonic(),
            cpu_seconds(self._pid),
            thread_cpu_seconds(self._pid, self._pid),
            scrape(self._url),
            machine_ticks(),
        )

    def between(self, before: Snapshot, after: Snapshot) -> dict[str, float | None]:
        wall = after.when - before.when
        workers = after.metrics.get("parley_model_workers", 1.0)

        def grew(prefix: str, label: str = "") -> float:
            """How much the samples named `prefix` (with `label`) grew between the two."""
            return _sum(after.metrics, prefix, label) - _sum(before.metrics, prefix, label)

        if any(k.startswith("parley_model_seconds_total") for k in after.metrics):
            busy = grew("parley_model_seconds_total")
            partial: float | None = grew("parley_model_seconds_total", 'kind="partial"')
        else:  # one worker, no split by kind
            busy = grew("parley_inference_seconds_sum")
            partial = None
        speculative = {
            f"speculative_{outcome}": grew(
                "parley_speculative_finals_total", f'outcome="{outcome}"'
            )
            for outcome in ("used", "discarded", "cancelled")
        }
        partials = {  # where the partials went: sent, or dropped by reason
            "partials_sent": grew("parley_partials_total"),
            **{
                f"partials_{reason}": grew("parley_partials_dropped_total", f'reason="{reason}"')
                for reason in PARTIAL_DROP_REASONS
            },
        }
        return {
            **speculative,
            **partials,
            # live finals the load gate sent without left context
            "contexts_shed": grew("parley_contexts_shed_total"),
            "server_cpu_cores": (after.cpu - before.cpu) / wall,
            "loop_cpu_cores": (after.loop_cpu - before.loop_cpu) / wall,
            "vad_windows_per_call": (
                grew("parley_vad_windows_total") / calls
                if (calls := grew("parley_vad_calls_total")) > 0
                else None
            ),
            **machine_shares(before.machine, after.machine),
            "model_utilization": busy / wall / workers,
            "batch_mean": (
                grew("parley_batch_size_sum") / batches
                if (batches := grew("parley_batch_size_count")) > 0
                else None
            ),
            "batch_p50": histogram_quantile(
                before.metrics, after.metrics, "parley_batch_size", 0.5
            ),
            "batch_p95": histogram_quantile(
                before.metrics, after.metrics, "parley_batch_size", 0.95
            ),
            "partial_share": None if partial is None or busy <= 0 else partial / busy,
            "workers": workers,
        }


# ---------------------------------------------------------------------- rows


def row(report: dict[str, Any], server: dict[str, float | None], interim: bool) -> dict[str, Any]:
    latency = report["latency"]
    final, queue = latency["final"], latency["server"]["queue"]
    cadence = report["partials_per_2s"]
    return {
        "rooms": report["totals"]["rooms"],
        "partials": "on" if interim else "off",
        "passed": report["verdict"]["passed"],
        "reasons": report["verdict"]["reasons"],
        "final_p50": final["p50"],
        "final_p95": final["p95"],
        "final_p99": final["p99"],
        "trend": latency["final_trend"],
        "lost": report["totals"]["lost"],
        "wer": report["wer"]["overall"],
        "first_partial_p50": latency["first_partial"]["p50"] if interim else None,
        "partials_per_2s_min": cadence["min"] if interim else None,
        "partials_per_2s_p50": cadence["p50"] if interim else None,
        "queue_wait_p50": queue["p50"],
        "queue_wait_p95": queue["p95"],
        "until_close_p50": latency.get("until_close", {}).get("p50"),
        "until_close_p95": latency.get("until_close", {}).get("p95"),
        "inference_p50": latency["server"]["inference"]["p50"],
        "inference_p95": latency["server"]["inference"]["p95"],
        "server_total_p50": latency["server"]["total"]["p50"],
        "server_total_p95": latency["server"]["total"]["p95"],
        **server,
    }


COLUMNS = (
    ("rooms", "rooms", "{}"),
    ("partials", "partials", "{}"),
    ("final P50/P95/P99 (s)", ("final_p50", "final_p95", "final_p99"), "{:.2f}"),
    ("WER", "wer", "{:.3f}"),
    ("lost", "lost", "{}"),
    ("first partial P50 (s)", "first_partial_p50", "{:.2f}"),
    ("partials/2 s min/P50", ("partials_per_2s_min", "partials_per_2s_p50"), "{:.2f}"),
    ("final queue P50/P95 (s)", ("queue_wait_p50", "queue_wait_p95"), "{:.2f}"),
    ("until close P50 (s)", "until_close_p50", "{:.2f}"),
    ("inference P50 (s)", "inference_p50", "{:.2f}"),
    ("close → sent P50/P95 (s)", ("server_total_p50", "server_total_p95"), "{:.2f}"),
    ("batch P50/P95 (bucket)", ("batch_p50", "batch_p95"), "{:.0f}"),
    ("model util.", "model_utilization", "{:.0%}"),
    ("partial share", "partial_share", "{:.0%}"),
    (
        "speculative used/discarded/cancelled",
        ("speculative_used", "speculative_discarded", "speculative_cancelled"),
        "{:.0f}",
    ),
    ("server CPU (cores)", "server_cpu_cores", "{:.2f}"),
    ("event loop CPU (cores)", "loop_cpu_cores", "{:.2f}"),
    ("VAD windows per call", "vad_windows_per_call", "{:.1f}"),
    ("machine idle/steal", ("machine_idle", "machine_steal"), "{:.0%}"),
    ("result", "result", "{}"),
)


def partial_fates(values: dict[str, Any]) -> str:
    """One line: a row's partials sent and dropped, by reason."""
    dropped = ", ".join(
        f"{reason} {values.get(f'partials_{reason}', 0):.0f}" for reason in PARTIAL_DROP_REASONS
    )
    sent = values.get("partials_sent", 0)
    rooms = f"{values['rooms']} rooms, partials {values['partials']}"
    return f"{rooms}: sent {sent:.0f}; dropped: {dropped}"


def _cell(values: dict[str, Any], keys: str | tuple[str, ...], fmt: str) -> str:
    if keys == "result":
        if values["passed"]:
            return "pass"
        return "fail: " + "; ".join(values["reasons"])
    parts = [values[k] for k in ((keys,) if isinstance(keys, str) else keys)]
    return " / ".join("—" if v is None else fmt.format(v) for v in parts)


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| " + " | ".join(title for title, _, _ in COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for values in rows:
        lines.append("| " + " | ".join(_cell(values, k, f) for _, k, f in COLUMNS) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------- runs


def _modes(interim: str) -> list[bool]:
    return {"on": [True], "off": [False], "both": [True, False]}[interim]


async def measure(args: argparse.Namespace, url: str, probe: ServerProbe) -> list[dict[str, Any]]:
    report_dir = Path(args.report_dir)
    limits = Limits(slo_p95=args.slo_p95)
    base = LoadSettings(
        server=url.replace("http://", "ws://"),
        corpus=default_corpus_dir(),
        duration_s=args.duration,
        progress=False,
    )
    corpus = prepare_corpus(base)
    rows: list[dict[str, Any]] = []
    for interim in _modes(args.interim):
        settings = replace(base, stream=replace(base.stream, interim_results=interim))
        if args.find_max_rooms:
            before = probe.snapshot()

            def on_trial(rooms: int, report: dict[str, Any], interim: bool = interim) -> None:
                nonlocal before
                after = probe.snapshot()
                rows.append(row(report, probe.between(before, after), interim))
                print(markdown(rows[-1:]).splitlines()[-1], flush=True)
                before = after

            search = SearchSettings(args.rooms[0], args.max_rooms, args.search_budget)
            summary, best = await find_max_rooms(settings, limits, search, on_trial)
            mode = "on" if interim else "off"
            print(f"partials {mode}: max rooms at the SLO: {summary['max_rooms']}", flush=True)
            if best is not None:
                write_report(best, report_dir / f"best-{mode}", summary)
            continue
        for count in args.rooms:
            trial = replace(settings, rooms=count)
            before = probe.snapshot()
            report = await run_load(trial, limits, corpus)
            rows.append(row(report, probe.between(before, probe.snapshot()), interim))
            print(markdown(rows[-1:]).splitlines()[-1], flush=True)
            write_report(report, report_dir / f"{count}-{'on' if interim else 'off'}")
            await asyncio.sleep(args.pause)  # let the last finals' batches clear
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("settings", nargs="*", help="KEY=VALUE server environment variables")
    parser.add_argument(
        "--rooms",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[2, 4, 8],
        help="room counts to run, comma separated (the search's start with --find-max-rooms)",
    )
    parser.add_argument("--interim", choices=("on", "off", "both"), default="on")
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--slo-p95", type=float, default=1.2)
    parser.add_argument("--find-max-rooms", action="store_true")
    parser.add_argument("--max-rooms", type=int, default=128)
    parser.add_argument("--search-budget", type=float, default=900.0)
    parser.add_argument("--pause", type=float, default=3.0, help="seconds between runs")
    parser.add_argument("--report-dir", default="reports/capacity")
    parser.add_argument(
        "--stand-in", action="store_true", help="bench.fake_server's stand-in model"
    )
    args = parser.parse_args()
    env = dict(os.environ, PARLEY_LOG_LEVEL="warning")
    for item in args.settings:
        key, _, value = item.partition("=")
        env[key] = value
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    report_dir = Path(args.report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    log = open(report_dir / "server.log", "wb")  # noqa: SIM115
    module = "bench.fake_server" if args.stand_in else "server"
    server = subprocess.Popen(
        [sys.executable, "-m", module, "--port", str(port)],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_ready(url, server)
        print("settings:", " ".join(args.settings) or "(defaults)", flush=True)
        # what the server logs when its model is ready, from the same settings
        print(describe_plan(plan_engine(Settings.from_env(env))), flush=True)
        print(markdown([]), flush=True)
        rows = asyncio.run(measure(args, url, ServerProbe(url, server.pid)))
        (report_dir / "capacity.json").write_bytes(
            orjson.dumps({"settings": args.settings, "rows": rows}, option=orjson.OPT_INDENT_2)
        )
        print()
        print(markdown(rows))
        for r in rows:
            print(partial_fates(r))
        return 0 if rows and all(r["passed"] for r in rows) else 1
    finally:
        server.terminate()
        server.wait(60)
        log.close()


if __name__ == "__main__":
    sys.exit(main())
