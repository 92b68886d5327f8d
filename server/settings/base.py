"""What every settings group is made of: documented fields, the refusal a bad value
gets, the checks the groups share, and parsing a variable's text to its field's type.

A refusal names the variable, the value and what is allowed, on one line: the server
prints it and exits 2 (`python -m server`). The checks are written so that NaN fails
every one of them.
"""

from __future__ import annotations

import math
import types
from collections.abc import Collection
from dataclasses import field
from typing import Any, Literal, Union, get_args, get_origin

ENV_PREFIX = "PARLEY_"


def setting(default: Any, help: str, *, secret: bool = False) -> Any:
    """A documented field (`help` feeds `--help` and docs/configuration.md); a secret one
    is left out of the repr."""
    return field(default=default, metadata={"help": help, "secret": secret}, repr=not secret)


def variable(name: str) -> str:
    """The environment variable of the field `name`: `PARLEY_<NAME>`."""
    return ENV_PREFIX + name.upper()


class SettingError(ValueError):
    """A value a setting does not allow: `PARLEY_<NAME>=<value>: <what is allowed>`."""

    def __init__(self, name: str, value: object, allowed: str) -> None:
        self.variable = variable(name)
        super().__init__(f"{self.variable}={value!r}: {allowed}")


def one_of(group: object, name: str, choices: Collection[str]) -> None:
    value = getattr(group, name)
    if value not in choices:
        raise SettingError(name, value, "must be one of " + ", ".join(choices))


def within(group: object, name: str, low: float, high: float, unit: str = "") -> None:
    """`low <= value <= high` (and not NaN)."""
    value = getattr(group, name)
    if not low <= value <= high:
        raise SettingError(name, value, f"must lie in [{low:g}, {high:g}]{unit}")


def at_least(group: object, name: str, low: float, meaning: str = "") -> None:
    value = getattr(group, name)
    if not value >= low:
        raise SettingError(name, value, f"must be >= {low:g}{meaning}")


def positive(group: object, *names: str) -> None:
    for name in names:
        value = getattr(group, name)
        if not value > 0:
            raise SettingError(name, value, "must be > 0")


def parse(name: str, raw: str, kind: Any) -> Any:
    """The text of variable `name` as a value of type `kind` (`str | None`: empty is None)."""
    if get_origin(kind) in (Union, types.UnionType):
        if raw == "":
            return None
        kind = next(a for a in get_args(kind) if a is not type(None))
    if get_origin(kind) is Literal:  # a choice: the group's check names the allowed values
        return raw
    if kind is bool:
        if raw.lower() in {"1", "true", "yes", "on"}:
            return True
        if raw.lower() in {"0", "false", "no", "off"}:
            return False
        raise ValueError(f"{name}={raw!r}: must be true or false (1/0, yes/no, on/off)")
    if kind is int:
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"{name}={raw!r}: must be a whole number") from None
    if kind is float:
        try:
            value = float(raw)
        except ValueError:
            raise ValueError(f"{name}={raw!r}: must be a number") from None
        if math.isnan(value):
            raise ValueError(f"{name}={raw!r}: must be a number")
        return value
    return kind(raw)
