"""A self-contained HTML page for a load report: inline SVG charts, no scripts, no assets.

Charts: latency CDF (partial and final), latency over the run, WER per room; then the
summary, the per-room table and, for --find-max-rooms, the search steps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Any

from loadgen.report import render_summary

WIDTH, HEIGHT = 720, 300
LEFT, RIGHT, TOP, BOTTOM = 60, 20, 30, 45
MAX_POINTS = 3000  # per series, so that the page stays small at hundreds of rooms


@dataclass(frozen=True, slots=True)
class Series:
    name: str
    points: Sequence[tuple[float, float]]
    color: str
    style: str = "line"  # "line" or "dots"


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values covering [low, high]: 0..1.13 → 0, 0.2, ..., 1.2."""
    if not (math.isfinite(low) and math.isfinite(high)) or high <= low:
        return [low]
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.floor(low / step) * step
    ticks: list[float] = []
    value = first
    while value < high + step * 0.999 and len(ticks) < 4 * count:
        ticks.append(round(value, 10))
        value += step
    return ticks


def thin(
    points: Sequence[tuple[float, float]], limit: int = MAX_POINTS
) -> list[tuple[float, float]]:
    """At most `limit` points, evenly strided, keeping the first and last."""
    if len(points) <= limit:
        return list(points)
    stride = (len(points) - 1) / (limit - 1)
    return [points[round(i * stride)] for i in range(limit)]


def cdf_points(values: Sequence[float], limit: int = 400) -> list[tuple[float, float]]:
    """(value, fraction ≤ value) steps of the empirical CDF, thinned to `limit` points."""
    ordered = sorted(values)
    n = len(ordered)
    steps = [(v, f) for i, v in enumerate(ordered) for f in (i / n, (i + 1) / n)]
    return thin(steps, limit)


def line_chart(
    title: str,
    series: Sequence[Series],
    x_label: str,
    y_label: str,
    *,
    x_min: float | None = None,
    y_min: float | None = None,
    hline: tuple[float, str] | None = None,
) -> str:
    """An SVG chart of line and dot series sharing axes."""
    xs = [x for s in series for x, _ in s.points]
    ys = [y for s in series for _, y in s.points] + ([hline[0]] if hline else [])
    if not xs:
        return f"<figure><figcaption>{escape(title)}</figcaption><p>no data</p></figure>"
    x_ticks = nice_ticks(min(xs) if x_min is None else x_min, max(xs))
    y_ticks = nice_ticks(min(ys) if y_min is None else y_min, max(ys))
    x0, x1 = x_ticks[0], max(x_ticks[-1], x_ticks[0] + 1e-9)
    y0, y1 = y_ticks[0], max(y_ticks[-1], y_ticks[0] + 1e-9)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * plot_w

    def py(y: float) -> float:
        return TOP + plot_h - (y - y0) / (y1 - y0) * plot_h

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="11">',
        f'<text x="{WIDTH / 2}" y="16" text-anchor="middle" font-size="13">{escape(title)}</text>',
    ]
    for x in x_ticks:
        parts.append(
            f'<line x1="{px(x):.1f}" y1="{TOP}" x2="{px(x):.1f}" y2="{TOP + plot_h}" '
            f'stroke="#eee"/><text x="{px(x):.1f}" y="{TOP + plot_h + 14}" '
            f'text-anchor="middle">{x:g}</text>'
        )
    for y in y_ticks:
        parts.append(
            f'<line x1="{LEFT}" y1="{py(y):.1f}" x2="{LEFT + plot_w}" y2="{py(y):.1f}" '
            f'stroke="#eee"/><text x="{LEFT - 6}" y="{py(y) + 4:.1f}" '
            f'text-anchor="end">{y:g}</text>'
        )
    parts.append(
        f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 8}" text-anchor="middle">'
        f"{escape(x_label)}</text>"
        f'<text transform="translate(14 {TOP + plot_h / 2}) rotate(-90)" '
        f'text-anchor="middle">{escape(y_label)}</text>'
    )
    if hline is not None:
        value, label = hline
        parts.append(
            f'<line x1="{LEFT}" y1="{py(value):.1f}" x2="{LEFT + plot_w}" y2="{py(value):.1f}" '
            f'stroke="#c00" stroke-dasharray="4 3"/><text x="{LEFT + plot_w - 4}" '
            f'y="{py(value) - 4:.1f}" text-anchor="end" fill="#c00">{escape(label)}</text>'
        )
    for number, s in enumerate(series):
        points = thin(s.points)
        if s.style == "dots":
            parts.append(f'<g fill="{s.color}" fill-opacity="0.5">')
            parts += [f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="1.8"/>' for x, y in points]
            parts.append("</g>")
        else:
            path = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in points)
            parts.append(
                f'<polyline fill="none" stroke="{s.color}" stroke-width="1.6" points="{path}"/>'
            )
        legend_y = TOP + 12 + 14 * number
        parts.append(
            f'<rect x="{LEFT + 8}" y="{legend_y - 8}" width="10" height="10" fill="{s.color}"/>'
            f'<text x="{LEFT + 22}" y="{legend_y + 1}">{escape(s.name)}</text>'
        )
    parts.append(
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" '
        'fill="none" stroke="#888"/></svg>'
    )
    return "".join(parts)


def bar_chart(title: str, labels: Sequence[str], values: Sequence[float], y_label: str) -> str:
    """An SVG bar chart, one bar per label."""
    if not values:
        return f"<figure><figcaption>{escape(title)}</figcaption><p>no data</p></figure>"
    y_ticks = nice_ticks(0.0, max(max(values), 0.01))
    top = y_ticks[-1]
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    slot = plot_w / len(values)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="11">',
        f'<text x="{WIDTH / 2}" y="16" text-anchor="middle" font-size="13">{escape(title)}</text>',
    ]
    for y in y_ticks:
        ypix = TOP + plot_h - y / top * plot_h
        parts.append(
            f'<line x1="{LEFT}" y1="{ypix:.1f}" x2="{LEFT + plot_w}" y2="{ypix:.1f}" '
            f'stroke="#eee"/><text x="{LEFT - 6}" y="{ypix + 4:.1f}" text-anchor="end">{y:g}'
            "</text>"
        )
    label_every = max(1, math.ceil(len(values) / 40))
    for i, (label, value) in enumerate(zip(labels, values, strict=True)):
        height = value / top * plot_h
        x = LEFT + i * slot
        parts.append(
            f'<rect x="{x + slot * 0.1:.1f}" y="{TOP + plot_h - height:.1f}" '
            f'width="{slot * 0.8:.1f}" height="{height:.1f}" fill="#4a7ab5">'
            f"<title>{escape(label)}: {value:.3f}</title></rect>"
        )
        if i % label_every == 0:
            parts.append(
                f'<text x="{x + slot / 2:.1f}" y="{TOP + plot_h + 14}" '
                f'text-anchor="middle">{escape(label)}</text>'
            )
    parts.append(
        f'<text transform="translate(14 {TOP + plot_h / 2}) rotate(-90)" '
        f'text-anchor="middle">{escape(y_label)}</text>'
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" '
        'stroke="#888"/></svg>'
    )
    return "".join(parts)


FINAL_COLOR, PARTIAL_COLOR = "#1f5fa8", "#e08a1e"


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{escape(str(h))}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{escape(_cell(v))}</td>" for v in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def render_html(report: Mapping[str, Any], search: Mapping[str, Any] | None = None) -> str:
    """The whole report page."""
    series = report["series"]
    finals = [(t, lat) for t, lat, *_ in series["final"]]
    partials = [(t, lat) for t, lat in series["partial"]]
    slo = report["verdict"]["slo_p95"]
    hline = (slo, f"SLO P95 {slo:g} s") if slo is not None else None
    cdf = line_chart(
        "Latency CDF",
        [
            Series("partial", cdf_points([lat for _, lat in partials]), PARTIAL_COLOR),
            Series("final", cdf_points([lat for _, lat in finals]), FINAL_COLOR),
        ],
        "latency (s)",
        "fraction ≤ latency",
        x_min=0.0,
        y_min=0.0,
    )
    over_time = line_chart(
        "Latency over the run",
        [
            Series("partial", partials, PARTIAL_COLOR, "dots"),
            Series("final", finals, FINAL_COLOR, "dots"),
        ],
        "time since start (s)",
        "latency (s)",
        y_min=0.0,
        hline=hline,
    )
    rooms = report["rooms"]
    wer_chart = bar_chart(
        "WER per room", [str(r["room"]) for r in rooms], [r["wer"] for r in rooms], "WER"
    )
    room_table = _table(
        [
            "room",
            "meeting",
            "utterances",
            "finals",
            "lost",
            "dup",
            "spurious",
            "WER",
            "final p50",
            "final p95",
            "errors",
        ],
        [
            [
                r["room"],
                r["meeting_id"],
                r["utterances"],
                r["finals"],
                r["lost"],
                r["duplicates"],
                r["spurious"],
                r["wer"],
                r["final_latency"]["p50"],
                r["final_latency"]["p95"],
                ", ".join(f"{k}: {v}" for k, v in r["errors"].items()) or "-",
            ]
            for r in rooms
        ],
    )
    search_html = ""
    if search is not None:
        search_html = (
            "<h2>Room search</h2>"
            + _table(
                ["rooms", "final p95 (s)", "passed", "why not"],
                [
                    [s["rooms"], s["final_p95"], s["passed"], "; ".join(s["reasons"])]
                    for s in search["steps"]
                ],
            )
            + f"<p>Largest passing: <b>{escape(str(search['max_rooms']))}</b> rooms. "
            f"{escape(search['stopped'])}</p>"
        )
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Parley load report</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; max-width: 60em; }}
table {{ border-collapse: collapse; font-size: 13px; margin: 1em 0; }}
td, th {{ border: 1px solid #ccc; padding: 2px 8px; text-align: right; }}
pre {{ background: #f6f6f6; padding: 1em; overflow-x: auto; }}
svg {{ display: block; margin: 1em 0; max-width: 100%; height: auto; }}
</style></head><body>
<h1>Parley load report</h1>
<pre>{escape(render_summary(report))}</pre>
{search_html}
{cdf}
{over_time}
{wer_chart}
<h2>Rooms</h2>
{room_table}
</body></html>
"""
