"""The server's settings, read once from the environment (`PARLEY_*`), in typed groups.

Each group (`settings.model`, `settings.scheduler`, …) is a frozen dataclass that checks
its own fields; `Settings` holds the groups and checks what spans two of them. A bad
value fails construction with a `SettingError` naming the variable, the value and what
is allowed, so `python -m server` refuses it at start (exit 2, one line).

Every field documents itself: `python -m server --help` and docs/configuration.md are
generated from the same metadata, under the groups' titles, so they cannot drift from
the code. A field's name is unique across the groups and its variable is
`PARLEY_<FIELD>`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, get_type_hints

from server.settings.base import ENV_PREFIX, SettingError, parse, variable
from server.settings.recognition import (
    MAX_PROMPT_TOKENS,
    ContextSettings,
    ModelSettings,
    SchedulerSettings,
    SegmenterSettings,
    SpeakerSettings,
)
from server.settings.service import (
    AuthSettings,
    ServerSettings,
    StoreSettings,
    StreamSettings,
    UploadSettings,
)
from server.settings.turns import TurnSettings

__all__ = [
    "ENV_PREFIX",
    "AuthSettings",
    "ContextSettings",
    "ModelSettings",
    "SchedulerSettings",
    "SegmenterSettings",
    "ServerSettings",
    "SettingError",
    "Settings",
    "SpeakerSettings",
    "StoreSettings",
    "StreamSettings",
    "TurnSettings",
    "UploadSettings",
    "field_groups",
    "groups",
    "markdown_table",
]

# Packaged multilingual models: their prompt has a task token more than English-only ones.
MULTILINGUAL_MODELS = frozenset({"base"})


@dataclass(frozen=True, slots=True)
class Settings:
    server: ServerSettings = field(default_factory=ServerSettings)
    model: ModelSettings = field(default_factory=ModelSettings)
    context: ContextSettings = field(default_factory=ContextSettings)
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)
    segmenter: SegmenterSettings = field(default_factory=SegmenterSettings)
    turns: TurnSettings = field(default_factory=TurnSettings)
    speakers: SpeakerSettings = field(default_factory=SpeakerSettings)
    streams: StreamSettings = field(default_factory=StreamSettings)
    auth: AuthSettings = field(default_factory=AuthSettings)
    uploads: UploadSettings = field(default_factory=UploadSettings)
    store: StoreSettings = field(default_factory=StoreSettings)

    def __post_init__(self) -> None:
        """What spans groups (each group has checked its own fields)."""
        if self.model.model in MULTILINGUAL_MODELS:
            most = MAX_PROMPT_TOKENS - 1  # the task token
            if self.context.prompt_tokens > most:
                raise SettingError(
                    "prompt_tokens",
                    self.context.prompt_tokens,
                    f"must be <= {most} with the multilingual PARLEY_MODEL={self.model.model}",
                )
        turns, silence = self.turns, self.segmenter.min_silence_ms
        if turns.turn_model and not turns.turn_silence_ms < silence <= turns.turn_hold_ms:
            raise SettingError(
                "turn_silence_ms",
                turns.turn_silence_ms,
                f"must be below PARLEY_MIN_SILENCE_MS ({silence:g}), and PARLEY_TURN_HOLD_MS "
                "at least that, while PARLEY_TURN_MODEL is on",
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Read every `PARLEY_<FIELD>` variable; `overrides` (by field name, any group)
        win over the environment. An unknown override name is a TypeError."""
        environ = os.environ if environ is None else environ
        values: dict[str, dict[str, Any]] = {name: {} for name, _ in groups()}
        for group, kind in groups():
            hints = get_type_hints(kind)
            for f in dataclasses.fields(kind):
                name = variable(f.name)
                if name in environ:
                    values[group][f.name] = parse(name, environ[name], hints[f.name])
        owners = field_groups()
        for name, value in overrides.items():
            if name not in owners:
                raise TypeError(f"no setting is named {name!r}")
            values[owners[name]][name] = value
        return cls(**{group: kind(**values[group]) for group, kind in groups()})

    @classmethod
    def describe(cls) -> list[tuple[str, str, str]]:
        """(variable, default, meaning) for every setting, group by group."""
        return [row for _, rows in cls.describe_groups() for row in rows]

    @classmethod
    def describe_groups(cls) -> list[tuple[str, list[tuple[str, str, str]]]]:
        """(group title, [(variable, default, meaning), …]) for every group."""
        return [
            (
                kind.TITLE,
                [
                    (
                        variable(f.name),
                        "" if f.default is None else str(f.default),
                        f.metadata["help"],
                    )
                    for f in dataclasses.fields(kind)
                ],
            )
            for _, kind in groups()
        ]


def groups() -> list[tuple[str, Any]]:
    """(attribute, group class) of every group of `Settings`, in order."""
    return [(f.name, f.default_factory) for f in dataclasses.fields(Settings)]


def field_groups() -> dict[str, str]:
    """{field name: its group's attribute} over every group."""
    owners: dict[str, str] = {}
    for group, kind in groups():
        for f in dataclasses.fields(kind):
            if owners.setdefault(f.name, group) != group:
                raise TypeError(f"setting {f.name!r} is in both {owners[f.name]} and {group}")
    return owners


field_groups()  # fails at import if two groups name the same field


def markdown_table() -> str:
    """docs/configuration.md's body: one table per group, under its title."""
    parts = []
    for title, rows in Settings.describe_groups():
        lines = [f"## {title}", "", "| variable | default | meaning |", "|---|---|---|"]
        lines += [f"| `{name}` | `{default}` | {meaning} |" for name, default, meaning in rows]
        parts.append("\n".join(lines))
    return "\n\n".join(parts)
