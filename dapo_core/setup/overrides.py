"""Dotted config values typed against the config dataclasses' field types: the one rule behind
`--set`, `--grid`, a ladder's `set` and `grid` tables, the Prefect form's `overrides` and
`ExperimentConfig.with_overrides`.

The rule, by the field's type hint:
- text (a command line, a form's text box) is parsed as the field's type: "0.28" → 0.28 for a
  float, "8" → 8 for an int, true/false (also yes/no, on/off, 1/0) for a bool, none/null/""
  → None for an optional field, "[0.9,0.95]" or "0.9,0.95" for a tuple ("" the empty one);
  a str field keeps it;
- a typed value (TOML, JSON, Python) must be of the field's kind already: an int widens to a
  float, a list becomes a tuple; a bool is never a number, nor 1 a bool.
Anything else is a ValueError of one line (`algo.clip_high='x': expected a number`, `algo.nope:
no such config field (algo has: ...)`) that each caller prefixes with where the value came from
(`--set`, `--grid`, `set`, `overrides`).

The config is passed in (`schema`, the ExperimentConfig class) rather than imported, so that
config.py's `with_overrides` can call this module: it imports only the standard library.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any

TOP_LEVEL = ("arm", "preset")
"""ExperimentConfig's own fields: chosen by the arm and the preset, never by an override."""

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")
_NONE = ("none", "null", "")


@functools.cache
def field_types(schema: type) -> dict[str, Any]:
    """{"algo.clip_high": float, "algo.clip_c": float | None, ...}: the dotted fields of a config
    dataclass whose fields are section dataclasses (ExperimentConfig), with their type hints."""
    out: dict[str, Any] = {}
    for section, cls in typing.get_type_hints(schema).items():
        if dataclasses.is_dataclass(cls):
            for name, hint in typing.get_type_hints(cls).items():
                out[f"{section}.{name}"] = hint
    return out


def type_value(schema: type, key: str, value: Any) -> Any:
    """`value` typed as config field `key` of `schema` (see the module's rule); ValueError of
    one line naming the key otherwise."""
    hints = field_types(schema)
    if key not in hints:
        raise ValueError(_unknown(key, hints))
    return _typed(key, value, hints[key])


def type_overrides(schema: type, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """{dotted key: value} typed field by field; the top-level arm and preset are refused (the
    arm and the preset name them). The first bad key or value is the error."""
    out: dict[str, Any] = {}
    for key, value in overrides.items():
        if not isinstance(key, str):
            raise ValueError(f"{key!r}: a config key is text, e.g. algo.clip_high")
        if key in TOP_LEVEL:
            raise ValueError(f"{key}: not settable as an override (choose the {key} itself)")
        out[key] = type_value(schema, key, value)
    return out


def parse_sets(schema: type, items: Iterable[str], flag: str = "--set") -> dict[str, Any]:
    """["algo.clip_high=0.3", ...] → {"algo.clip_high": 0.3}; errors begin with `flag`."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"{flag} {item!r}: expected section.field=value")
        try:
            out.update(type_overrides(schema, {key: raw.strip()}))
        except ValueError as exc:
            raise ValueError(f"{flag} {exc}") from None
    return out


def parse_grid(schema: type, items: Iterable[str]) -> list[tuple[str, list[Any]]]:
    """["algo.clip_high=0.24,0.28"] → [("algo.clip_high", [0.24, 0.28])] for expand_grid, each
    value typed like --set. A tuple field takes bracketed values: optim.betas=[0.9,0.95],[0.9,0.99]."""
    grids: list[tuple[str, list[Any]]] = []
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        values = split_top_level(raw)
        if not sep or not key or not values or any(not v for v in values):
            raise ValueError(f"--grid {item!r}: expected section.field=v1,v2,...")
        typed = [parse_sets(schema, [f"{key}={v}"], flag="--grid")[key] for v in values]
        grids.append((key, typed))
    return grids


def split_top_level(text: str) -> list[str]:
    """Split at commas outside brackets: "0.1,0.2" → two values, "[0.9,0.95],[0.9,0.99]" → two."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += ch
    parts.append(current.strip())
    return [] if parts == [""] else parts


def _unknown(key: str, hints: Mapping[str, Any]) -> str:
    section, _, name = key.partition(".")
    sections = sorted({k.partition(".")[0] for k in hints})
    if not name:
        return f"{key}: not a config field: use section.field (e.g. algo.clip_high)"
    if section not in sections:
        return f"{key}: unknown section {section!r} (sections: {', '.join(sections)})"
    names = sorted(k.partition(".")[2] for k in hints if k.startswith(section + "."))
    return f"{key}: no such config field ({section} has: {', '.join(names)})"


def _typed(key: str, value: Any, hint: Any) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union) and type(None) in args:
        if value is None or (isinstance(value, str) and value.strip().lower() in _NONE):
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _typed(key, value, inner)
    if isinstance(value, str) and hint is not str:
        return _from_text(key, value.strip(), hint)
    if origin is tuple:
        if not isinstance(value, list | tuple) or (... not in args and len(value) != len(args)):
            raise ValueError(f"{key}={value!r}: expected {_list_of(hint)}")
        return tuple(_typed(key, v, args[0]) for v in value)
    if hint is bool and not isinstance(value, bool):
        raise ValueError(f"{key}={value!r}: expected true or false")
    if hint is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"{key}={value!r}: expected an integer")
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{key}={value!r}: expected a number")
        return float(value)
    if hint is str and not isinstance(value, str):
        raise ValueError(f"{key}={value!r}: expected a string")
    return value


def _from_text(key: str, text: str, hint: Any) -> Any:
    """Text for a non-text field, parsed as that field's type (what --set has always done)."""
    if hint is bool:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ValueError(f"{key}={text!r}: expected true or false")
    if hint is int:
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{key}={text!r}: expected an integer") from None
    if hint is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{key}={text!r}: expected a number") from None
    if typing.get_origin(hint) is tuple:
        try:
            # "" is the empty list (run.loggers=), "a,b" or "[a,b]" a list of two.
            items = json.loads(text) if text.startswith("[") else text.split(",") if text else []
        except json.JSONDecodeError:
            items = None
        if not isinstance(items, list):
            raise ValueError(f"{key}={text!r}: expected {_list_of(hint)}")
        return _typed(key, items, hint)
    return text


_PLURALS = {bool: "true/false values", int: "integers", float: "numbers", str: "strings"}


def _list_of(hint: Any) -> str:
    """`tuple[float, float]` → "a list of 2 numbers", `tuple[str, ...]` → "a list of strings"."""
    args = typing.get_args(hint)
    what = _PLURALS.get(args[0], "values")
    return f"a list of {what}" if ... in args else f"a list of {len(args)} {what}"
