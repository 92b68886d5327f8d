"""Run N concurrent rooms of real speech against a protocol v1 server, and search for the
most rooms it sustains within a latency SLO.

Every room is planned up front (corpus clips laid out as a conversation), rooms start
staggered over a ramp, each participant streams on its own socket, and what the sockets
saw becomes a report (`loadgen.report`). The run is bounded: every socket has open and
drain timeouts, and the whole run has a deadline derived from them.
"""

from __future__ import annotations

import asyncio
import collections
import random
import secrets
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from tqdm import tqdm

from loadgen.audio import Samples
from loadgen.client import (
    DEFAULT_SERVER,
    FinalEvent,
    PartialEvent,
    SourceLog,
    StreamOptions,
    stream_source,
)
from loadgen.corpus import (
    Clip,
    RoomPlan,
    ScriptShape,
    decode_clips,
    default_corpus_dir,
    load_manifest,
    plan_room,
    select_clips,
)
from loadgen.html_report import render_html
from loadgen.report import ClientHealth, Limits, RoomRun, build_report
from loadgen.search import RoomSearch
from wire.codes import DEFAULT_SAMPLE_RATE

LOOP_TICK = 0.05  # seconds between client event-loop lag samples
PROGRESS_TICK = 0.5


@dataclass(frozen=True, slots=True)
class LoadSettings:
    """One load run, as the CLI (or a test) configures it."""

    server: str = DEFAULT_SERVER
    rooms: int = 1
    participants_per_room: int = 1
    corpus: Path = field(default_factory=default_corpus_dir)
    duration_s: float = 60.0
    ramp_s: float | None = None  # room starts spread over this; None: min(10, duration / 4)
    max_clip_s: float = 30.0
    corpus_language: str | None = None  # clips to play and score; None: the stream's language
    seed: int = 0
    stream: StreamOptions = field(default_factory=StreamOptions)  # speed, language, timeouts
    run_id: str = field(default_factory=lambda: secrets.token_hex(3))
    progress: bool = True
    deadline_s: float | None = None  # whole run; None: derived from the timeouts (a safety net)

    def __post_init__(self) -> None:
        if self.rooms < 1 or self.participants_per_room < 1:
            raise ValueError("need at least one room and one participant per room")
        if self.duration_s <= 0:
            raise ValueError("duration must be positive")
        if self.ramp_s is not None and self.ramp_s < 0:
            raise ValueError("ramp must not be negative")
        if self.corpus_language == "auto":
            raise ValueError("the corpus language must be a language code, not auto")

    @property
    def clip_language(self) -> str:
        """The language of the clips played (and of the WER normaliser)."""
        if self.corpus_language is not None:
            return self.corpus_language
        return "en" if self.stream.language == "auto" else self.stream.language

    @property
    def ramp(self) -> float:
        return min(10.0, self.duration_s / 4) if self.ramp_s is None else self.ramp_s

    def report_config(self) -> dict[str, Any]:
        """The settings as the report records them, flat (the token only as present or not)."""
        config = asdict(self)
        config.update(config.pop("stream"), corpus=str(self.corpus), ramp_s=self.ramp)
        config["token"] = self.stream.token is not None
        return config


@dataclass(frozen=True, slots=True)
class PreparedCorpus:
    clips: list[Clip]
    audio: dict[str, Samples]


def prepare_corpus(settings: LoadSettings) -> PreparedCorpus:
    """Read the manifest and decode the clips the run will play (once per process)."""
    clips = select_clips(
        load_manifest(settings.corpus), settings.clip_language, settings.max_clip_s
    )
    return PreparedCorpus(clips, decode_clips(clips))


def plan_rooms(settings: LoadSettings, corpus: PreparedCorpus) -> list[RoomPlan]:
    shape = ScriptShape(duration_s=settings.duration_s)
    names = [f"p{j}" for j in range(settings.participants_per_room)]
    return [
        plan_room(
            f"lg-{settings.run_id}-r{i}",
            names,
            corpus.clips,
            corpus.audio,
            shape,
            random.Random(settings.seed * 1_000_003 + i),
            first_clip=i,
        )
        for i in range(settings.rooms)
    ]


class LiveStats:
    """What the progress bar shows, fed by the sockets' events."""

    def __init__(self) -> None:
        self.finals = 0
        self.partials = 0
        self.recent: collections.deque[float] = collections.deque(maxlen=500)

    def on_event(self, log: SourceLog, event: FinalEvent | PartialEvent) -> None:
        if isinstance(event, FinalEvent):
            self.finals += 1
            if event.latency is not None:
                self.recent.append(event.latency)
        else:
            self.partials += 1

    def p95(self) -> float | None:
        return float(np.percentile(list(self.recent), 95)) if self.recent else None


async def _sample_loop_lag(lags: list[float], stop: asyncio.Event) -> None:
    while not stop.is_set():
        before = time.perf_counter()
        await asyncio.sleep(LOOP_TICK)
        lags.append(max(0.0, time.perf_counter() - before - LOOP_TICK))


async def _show_progress(
    bar: Any, logs: list[SourceLog], rooms: int, stats: LiveStats, stop: asyncio.Event
) -> None:
    while not stop.is_set():
        bar.n = round(sum(log.clock.samples_sent for log in logs) / DEFAULT_SAMPLE_RATE, 1)
        connected = sum(1 for log in logs if log.started is not None and not log.done)
        p95 = stats.p95()
        bar.set_postfix_str(
            f"live sources {connected}/{len(logs)} ({rooms} rooms) finals {stats.finals} "
            f"p95 {'-' if p95 is None else f'{p95:.2f}s'}",
            refresh=True,
        )
        try:
            async with asyncio.timeout(PROGRESS_TICK):
                await stop.wait()
        except TimeoutError:
            pass


async def run_load(
    settings: LoadSettings, limits: Limits, corpus: PreparedCorpus | None = None
) -> dict[str, Any]:
    """Run the rooms of `settings` to the end and return the report."""
    corpus = corpus if corpus is not None else prepare_corpus(settings)
    plans = plan_rooms(settings, corpus)
    options = settings.stream
    rooms = [
        RoomRun(plan, tuple(SourceLog(plan.meeting_id, p) for p in plan.participants))
        for plan in plans
    ]
    logs = [log for room in rooms for log in room.logs]
    deadline = settings.deadline_s
    if deadline is None:
        # Every socket ends within its own timeouts; at "max" speed the server is allowed
        # real time to take the audio.
        longest = max(plan.audio_seconds for plan in plans)
        pace = longest / (options.speed or 1.0)
        deadline = settings.ramp + pace + options.open_timeout + options.drain_timeout + 30.0

    epoch = time.monotonic()
    cpu_start = time.process_time()

    def clock() -> float:
        return time.monotonic() - epoch

    stats = LiveStats()
    stop = asyncio.Event()
    loop_lags: list[float] = []
    total_audio = sum(p.audio_seconds * len(p.participants) for p in plans)
    bar = tqdm(
        total=round(total_audio, 1),
        unit="s",
        desc="audio sent",
        disable=None if settings.progress else True,  # None: shown on a terminal only
        file=sys.stderr,
        dynamic_ncols=True,
        bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total:.0f} s [{elapsed}] {postfix}",
    )

    async def room_task(index: int, room: RoomRun) -> None:
        delay = index * settings.ramp / settings.rooms - clock()
        if delay > 0:
            await asyncio.sleep(delay)  # staggered start
        await asyncio.gather(
            *(
                stream_source(
                    log,
                    settings.server,
                    room.plan.tracks[log.participant],
                    options,
                    clock=clock,
                    on_event=stats.on_event,
                )
                for log in room.logs
            )
        )

    monitors = [
        asyncio.create_task(_sample_loop_lag(loop_lags, stop)),
        asyncio.create_task(_show_progress(bar, logs, settings.rooms, stats, stop)),
    ]
    try:
        async with asyncio.timeout(deadline):
            await asyncio.gather(*(room_task(i, room) for i, room in enumerate(rooms)))
    except TimeoutError:
        for log in logs:
            if log.ended is None:  # fail() keeps an earlier failure
                log.fail("run_deadline", f"the run passed its {deadline:g} s deadline")
    finally:
        stop.set()
        await asyncio.gather(*monitors)
        bar.close()
    health = ClientHealth(loop_lags, time.process_time() - cpu_start, clock())
    return build_report(settings.report_config(), rooms, health, limits, settings.clip_language)


def write_report(
    report: Mapping[str, Any], directory: Path, search: Mapping[str, Any] | None = None
) -> list[Path]:
    """Write report.json and report.html (and search.json) into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / "report.json", directory / "report.html"]
    paths[0].write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    paths[1].write_text(render_html(report, search), encoding="utf-8")
    if search is not None:
        paths.append(directory / "search.json")
        paths[2].write_bytes(orjson.dumps(search, option=orjson.OPT_INDENT_2))
    return paths


@dataclass(frozen=True, slots=True)
class SearchSettings:
    start: int = 1
    max_rooms: int = 256
    budget_s: float = 1800.0  # no trial starts that would not end within this


async def find_max_rooms(
    settings: LoadSettings,
    limits: Limits,
    search_settings: SearchSettings,
    on_trial: Callable[[int, dict[str, Any]], None] | None = None,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Double then bisect the number of rooms; return (search summary, best passing report)."""
    if limits.slo_p95 is None:
        raise ValueError("the room search needs an SLO (slo_p95)")
    search = RoomSearch(search_settings.start, search_settings.max_rooms)
    corpus = prepare_corpus(settings)
    began = time.monotonic()
    longest_trial = 0.0
    best_report: dict[str, Any] | None = None
    steps: list[dict[str, Any]] = []
    stopped = "converged"
    while (rooms := search.next_rooms()) is not None:
        estimate = longest_trial or settings.ramp + settings.duration_s / (
            settings.stream.speed or 8.0
        )
        if time.monotonic() - began + estimate > search_settings.budget_s:
            stopped = f"time budget of {search_settings.budget_s:g} s spent"
            break
        trial = replace(settings, rooms=rooms, run_id=f"{settings.run_id}-t{len(steps)}")
        report = await run_load(trial, limits, corpus)
        passed = bool(report["verdict"]["passed"])
        search.record(rooms, passed)
        longest_trial = max(longest_trial, report["totals"]["wall_seconds"])
        steps.append(
            {
                "rooms": rooms,
                "passed": passed,
                "final_p95": report["latency"]["final"]["p95"],
                "final_p50": report["latency"]["final"]["p50"],
                "final_p99": report["latency"]["final"]["p99"],
                "lost": report["totals"]["lost"],
                "errors": report["errors"],
                "reasons": report["verdict"]["reasons"],
                "wall_seconds": report["totals"]["wall_seconds"],
            }
        )
        if on_trial is not None:
            on_trial(rooms, report)
        if passed and rooms == search.best:
            best_report = report
        if report["client"]["fell_behind"]:
            stopped = (
                f"the client fell behind at {rooms} rooms: run the load generator on another "
                "machine (or several) to measure further"
            )
            break
    else:
        if search.best >= search_settings.max_rooms:
            stopped = f"reached --max-rooms {search_settings.max_rooms}"
    summary = {
        "slo_p95": limits.slo_p95,
        "max_rooms": search.best,
        "steps": steps,
        "stopped": stopped,
        "budget_s": search_settings.budget_s,
        "elapsed_s": time.monotonic() - began,
    }
    return summary, best_report
