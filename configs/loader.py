"""Load, override and validate run configs.

``load_config`` reads ``defaults.yaml``, lays the run's YAML over it, applies ``--set section.key=value``
overrides and builds a typed ``RunConfig``. Every mistake raises ``ConfigError`` naming the key and
what is allowed, so a typo never silently falls back to a default. What is allowed is read from the fields' types
(``Literal`` choices, ``Range`` markers: ``configs.field_rules``) and from the rules over several keys
(``configs.rules.RULES``).

Numbers: an integer key takes a float that is exactly an integer (1e6, 2.0) and refuses any other (1.5); a number
key takes exponent notation without a dot (1e6, 3e-4), which YAML 1.1 reads as a string. No value is YAML's
``null`` (or ``~``): a key that allows it refuses the string ``none``/``None`` with a message saying to write null,
rather than accept a second spelling that other YAML readers of the same file would take as a string. A run config
file that is empty (or only comments) is refused: it would silently run the defaults.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import typing
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from configs.field_rules import MayBeEmpty, Range
from configs.rules import first_problem
from configs.schema import SECTIONS, RunConfig

CONFIG_DIR = Path(__file__).resolve().parent
DEFAULTS_PATH = CONFIG_DIR / "defaults.yaml"
DEFAULT_RUN_CONFIG = CONFIG_DIR / "cartpole.yaml"


EXPONENT_NUMBER = re.compile(r"[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+")
"""A number in exponent notation that YAML 1.1 (PyYAML) reads as a string: 1e6, 3e-4, 1.5e6 (it wants a dot and a
signed exponent: 1.0e+6). A number key takes it as the number it spells."""

NONE_WORDS = ("none", "None", "NONE")
"""Python's spelling of no value, a string in YAML; a key that allows null says to write null."""


class ConfigError(ValueError):
    """A config value, key or file is wrong; the message says which and what is allowed."""


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> RunConfig:
    """Defaults, then the file at ``path`` (the embedded CartPole run when None), then ``--set`` overrides."""
    merged = _read_yaml(DEFAULTS_PATH)
    run_path = Path(path) if path is not None else DEFAULT_RUN_CONFIG
    if run_path.resolve() != DEFAULTS_PATH:
        _merge(merged, _read_yaml(run_path), source=str(run_path))
    for text in overrides:
        _apply_override(merged, text)
    return config_from_dict(merged)


def shipped_config_names() -> list[str]:
    """The names of the configs shipped in this package (configs/<name>.yaml), sorted."""
    return sorted(path.stem for path in CONFIG_DIR.glob("*.yaml"))


def resolve_config_path(text: str) -> Path:
    """``--config``'s value as a file: a path as given, or a bare name (no directory, no .yaml) as the shipped
    configs/<name>.yaml, found from any working directory; ConfigError listing the shipped names otherwise."""
    path = Path(text)
    if path.is_file() or path.parent != Path(".") or path.suffix in (".yaml", ".yml"):
        return path
    shipped = CONFIG_DIR / f"{text}.yaml"
    if shipped.is_file():
        return shipped
    raise ConfigError(f"--config {text!r}: no such file and no shipped config of that name; shipped configs: "
                      f"{', '.join(shipped_config_names())} (or pass a path to a YAML file)")


def parse_override(text: str) -> dict[str, dict[str, Any]]:
    """``section.key=value`` -> nested dict; the value is parsed as YAML (so 3, 0.5, true, null work).
    ``section.key.inner=value`` names a key inside a mapping-valued key (env.kwargs.n=6 -> {"env": {"kwargs":
    {"n": 6}}})."""
    (section, key, *inner), value = _split_override(text)
    for name in reversed(inner):
        value = {name: value}
    return {section: {key: value}}


def _split_override(text: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` -> (["a", "b", "c"], the value parsed as YAML)."""
    key, sep, raw = text.partition("=")
    parts = key.strip().split(".")
    if not sep or len(parts) < 2 or not all(parts):
        raise ConfigError(f"--set {text!r}: expected section.key=value, e.g. --set trainer.batch_size=8192 "
                          f"(or section.key.inner=value inside a mapping, e.g. --set env.kwargs.n=6)")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as err:
        raise ConfigError(f"--set {text!r}: value {raw!r} is not valid YAML ({err})") from err
    return parts, value


def _apply_override(merged: dict[str, Any], text: str) -> None:
    """Lay one ``--set`` over ``merged``: section.key=value replaces the key's value; section.key.inner=value
    sets one key inside a mapping-valued key (env.kwargs) and keeps its other keys."""
    source = f"--set {text}"
    (section, key, *inner), value = _split_override(text)
    if not inner:
        _merge(merged, {section: {key: value}}, source=source)
        return
    cls = _section_class(section, source)
    allowed = {f.name for f in dataclasses.fields(cls)}
    if key not in allowed:
        raise ConfigError(_unknown(f"{section}.{key}", key, allowed, source))
    if not _is_mapping_type(typing.get_type_hints(cls)[key]):
        raise ConfigError(f"{source}: '{section}.{key}' is not a mapping, so it has no keys inside it; "
                          f"keys that hold a mapping: {', '.join(_mapping_keys())}")
    current = dict((merged.get(section) or {}).get(key) or {})
    _merge(merged, {section: {key: _set_inside(current, inner, value, f"{section}.{key}", source)}}, source=source)


def _set_inside(mapping: dict[str, Any], path: Sequence[str], value: Any, dotted: str, source: str) -> dict[str, Any]:
    """A copy of ``mapping`` with ``value`` at the key path ``path`` (missing mappings on the way are made)."""
    head, *rest = path
    if not rest:
        return {**mapping, head: value}
    inner = mapping.get(head, {})
    if not isinstance(inner, Mapping):
        raise ConfigError(f"{source}: '{dotted}.{head}' is {inner!r}, not a mapping, so it has no keys inside it")
    return {**mapping, head: _set_inside(dict(inner), rest, value, f"{dotted}.{head}", source)}


def _is_mapping_type(hint: Any) -> bool:
    return (typing.get_origin(hint) or hint) is dict


def _mapping_keys() -> list[str]:
    """Every section.key whose value is a mapping (the keys --set section.key.inner=value can reach into)."""
    return [f"{name}.{f}" for name, cls in SECTIONS.items()
            for f, hint in typing.get_type_hints(cls).items() if _is_mapping_type(hint)]


def config_from_dict(data: Mapping[str, Any], *, source: str = "config") -> RunConfig:
    """Validate a nested mapping (as in YAML) into a RunConfig."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a mapping of sections, got {type(data).__name__}")
    sections: dict[str, Any] = {}
    for section_name, values in data.items():
        cls = _section_class(section_name, source)
        if values is None:
            values = {}
        if not isinstance(values, Mapping):
            raise ConfigError(f"{source}: section '{section_name}' must be a mapping of keys, got {values!r}")
        sections[section_name] = _build_section(section_name, cls, values, source)
    config = RunConfig(**sections)
    problem = first_problem(config)
    if problem is not None:
        raise ConfigError(f"{source}: {problem}")
    return config


def config_to_dict(config: RunConfig) -> dict[str, Any]:
    """The plain nested dict (YAML / msgpack friendly) of a RunConfig."""
    return dataclasses.asdict(config)


def replace_value(config: RunConfig, section: str, key: str, value: Any) -> RunConfig:
    """A copy of ``config`` with one validated value replaced (e.g. the --n of an actor host)."""
    data = config_to_dict(config)
    _merge(data, {section: {key: value}}, source=f"{section}.{key}")
    return config_from_dict(data)


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from err
    if data is None:
        if path.resolve() == DEFAULTS_PATH:
            return {}
        raise ConfigError(f"{path}: the config file is empty (no sections, only blank lines or comments), so the "
                          f"run would be configs/defaults.yaml's (trainer.total_timesteps "
                          f"{RunConfig().trainer.total_timesteps:,}); write the sections it changes, e.g. "
                          f"'trainer: {{total_timesteps: 1000000}}'")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level, got {type(data).__name__}")
    return data


def _merge(base: dict[str, Any], overlay: Mapping[str, Any], *, source: str) -> None:
    for section_name, values in overlay.items():
        cls = _section_class(section_name, source)
        if values is None:
            continue
        if not isinstance(values, Mapping):
            raise ConfigError(f"{source}: section '{section_name}' must be a mapping of keys, got {values!r}")
        allowed = {f.name for f in dataclasses.fields(cls)}
        for key in values:
            if key not in allowed:
                raise ConfigError(_unknown(f"{section_name}.{key}", key, allowed, source))
        base.setdefault(section_name, {})
        base[section_name] = {**(base[section_name] or {}), **values}


def _section_class(name: Any, source: str) -> type:
    if name not in SECTIONS:
        raise ConfigError(_unknown(str(name), str(name), set(SECTIONS), source, what="section"))
    return SECTIONS[name]


def _unknown(dotted: str, key: str, allowed: set[str], source: str, *, what: str = "key") -> str:
    hint = difflib.get_close_matches(key, sorted(allowed), n=1)
    suggestion = f" (did you mean '{hint[0]}'?)" if hint else ""
    return f"{source}: unknown {what} '{dotted}'{suggestion}; allowed: {', '.join(sorted(allowed))}"


def _build_section(section_name: str, cls: type, values: Mapping[str, Any], source: str) -> Any:
    hints = typing.get_type_hints(cls, include_extras=True)
    allowed = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in values.items():
        if key not in allowed:
            raise ConfigError(_unknown(f"{section_name}.{key}", key, allowed, source))
        dotted = f"{section_name}.{key}"
        kwargs[key] = _check_value(dotted, hints[key], value)
    return cls(**kwargs)


def _check_value(dotted: str, hint: Any, value: Any) -> Any:
    """``value`` checked against the field type ``hint``: its type, its ``Literal`` choices, its ``Range`` markers
    (``Annotated``; on a list's item type they bound each item)."""
    hint, markers = _split_annotated(hint)
    optional = type(None) in typing.get_args(hint)
    if optional:
        hint, inner = _split_annotated(next(a for a in typing.get_args(hint) if a is not type(None)))
        markers += inner
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{dotted}: a value is required ({_describe(hint)}), got null")
    origin = typing.get_origin(hint) or hint
    if optional and value in NONE_WORDS and value not in (typing.get_args(hint) if origin is typing.Literal else ()):
        raise ConfigError(f"{dotted}: {value!r} is a string in YAML, not no value: write null (or ~) for no value, "
                          f"otherwise {_describe(hint)}")
    if origin in (int, float) and isinstance(value, str) and EXPONENT_NUMBER.fullmatch(value.strip()):
        value = _exponent_number(dotted, hint, value)
    if origin is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{dotted}: expected true or false, got {value!r}")
        return value
    if origin is int:
        if isinstance(value, float) and value.is_integer():  # 1e6, 2.0: the integer it is exactly
            value = int(value)
        if isinstance(value, float) and math.isfinite(value):
            raise ConfigError(f"{dotted}: expected an integer, got {value!r} (a whole number such as 1000000 or "
                              f"1e6; {value!r} has a fractional part)")
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{dotted}: expected an integer, got {value!r}")
    elif origin is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{dotted}: expected a finite number, got {value!r}")
        value = float(value)
    elif origin is str or origin is typing.Literal:
        if not isinstance(value, str):
            raise ConfigError(f"{dotted}: expected a string, got {value!r}")
        choices = typing.get_args(hint) if origin is typing.Literal else None
        if choices is not None and value not in choices:
            raise ConfigError(f"{dotted}: {value!r} is not allowed; allowed: {', '.join(choices)}")
        return value
    elif origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{dotted}: expected a mapping, got {value!r}")
        return dict(value)
    elif origin is list:
        (item_hint,) = typing.get_args(hint)
        may_be_empty = any(isinstance(marker, MayBeEmpty) for marker in markers)
        if not isinstance(value, list) or not (value or may_be_empty):
            raise ConfigError(f"{dotted}: expected a {'' if may_be_empty else 'non-empty '}list (each item "
                              f"{_describe(item_hint)}), got {value!r}")
        return [_check_value(dotted, item_hint, item) for item in value]
    for marker in markers:
        if isinstance(marker, Range) and not marker.allows(value):
            raise ConfigError(f"{dotted}: {value!r} is out of range; allowed: {marker.describe()}")
    return value


def _exponent_number(dotted: str, hint: Any, text: str) -> float:
    """``text`` (an EXPONENT_NUMBER) as a float; ConfigError when it overflows."""
    number = float(text.strip().replace("_", ""))
    if not math.isfinite(number):
        raise ConfigError(f"{dotted}: {text!r} is too large a number; expected {_describe(hint)}")
    return number


def _split_annotated(hint: Any) -> tuple[Any, tuple[Any, ...]]:
    """``Annotated[T, *markers]`` -> (T, markers); any other hint -> (hint, ())."""
    if typing.get_origin(hint) is typing.Annotated:
        base, *markers = typing.get_args(hint)
        return base, tuple(markers)
    return hint, ()


def _plain(hint: Any) -> Any:
    """``hint`` without its ``Annotated`` markers, at any depth (``list[PositiveInt]`` -> ``list[int]``)."""
    hint, _ = _split_annotated(hint)
    origin = typing.get_origin(hint)
    if origin in (list, dict):
        return origin[tuple(_plain(arg) for arg in typing.get_args(hint))]
    return hint


def _describe(hint: Any) -> str:
    hint = _plain(hint)
    if typing.get_origin(hint) is typing.Literal:
        return "a string"
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(hint, str(hint))
