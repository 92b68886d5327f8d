"""Command-line pieces shared by `python -m loadgen` and `python -m loadgen.replay`."""

from __future__ import annotations

import argparse
import math
import re

from loadgen.client import DEFAULT_SERVER, StreamOptions, websocket_base


def parse_speed(text: str) -> float | None:
    """'1', '2.5' or 'max' (None: as fast as the socket accepts)."""
    return None if text.strip().lower() == "max" else positive_float(text)


def _finite(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text}")
    return value


def positive_float(text: str) -> float:
    value = _finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {text}")
    return value


def non_negative_float(text: str) -> float:
    value = _finite(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return value


def language(text: str) -> str:
    """An ISO 639-1 code such as 'es', or 'auto' (the server detects it per source)."""
    if not re.fullmatch(r"[a-z]{2,3}|auto", text):
        raise argparse.ArgumentTypeError(f"not a language code or 'auto': {text!r}")
    return text


def server_url(text: str) -> str:
    try:
        websocket_base(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def frame_ms(text: str) -> int:
    value = positive_int(text)
    if not 10 <= value <= 200:
        raise argparse.ArgumentTypeError(f"frame size must lie in 10..200 ms, not {value}")
    return value


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    """--server, --token, --language, --speed, --frame-ms, timeouts."""
    group = parser.add_argument_group("connection")
    group.add_argument(
        "--server",
        type=server_url,
        default=DEFAULT_SERVER,
        help=f"server base URL, ws:// or http:// (default {DEFAULT_SERVER})",
    )
    group.add_argument("--token", help="bearer token sent as 'Authorization: Bearer TOKEN'")
    group.add_argument(
        "--language",
        type=language,
        default="en",
        help="stream language: an ISO 639-1 code, or 'auto' for the server to detect it once "
        "per source (other languages than en need a multilingual server model; default en)",
    )
    group.add_argument(
        "--speed",
        type=parse_speed,
        default=1.0,
        metavar="1.0|N|max",
        help="pace audio at N x real time, or 'max' for as fast as the socket takes it "
        "(default 1.0)",
    )
    group.add_argument(
        "--frame-ms",
        type=frame_ms,
        default=40,
        metavar="MS",
        help="audio per binary frame, 10-200 ms (default 40)",
    )
    group.add_argument(
        "--no-interim",
        action="store_true",
        help="ask for finals only (interim_results=false)",
    )
    group.add_argument(
        "--open-timeout",
        type=positive_float,
        default=20.0,
        metavar="S",
        help="seconds to connect and get session.started (default 20)",
    )
    group.add_argument(
        "--drain-timeout",
        type=positive_float,
        default=120.0,
        metavar="S",
        help="seconds to wait for session.ended after stop (default 120)",
    )


def stream_options(args: argparse.Namespace) -> StreamOptions:
    """The options `add_connection_arguments` collected, for `stream_source`."""
    return StreamOptions(
        speed=args.speed,
        frame_ms=args.frame_ms,
        language=args.language,
        interim_results=not args.no_interim,
        token=args.token,
        open_timeout=args.open_timeout,
        drain_timeout=args.drain_timeout,
    )
