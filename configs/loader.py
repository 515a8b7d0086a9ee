"""Load, override and validate run configs.

``load_config`` reads ``defaults.yaml``, lays the run's YAML over it, applies ``--set section.key=value``
overrides and builds a typed ``RunConfig``. Every mistake raises ``ConfigError`` naming the key and
what is allowed, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import typing
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from configs.baselines import BASELINE_ENVS, BASELINE_FORMS, baseline_strength
from configs.schema import CHOICES, SECTIONS, RunConfig

CONFIG_DIR = Path(__file__).resolve().parent
DEFAULTS_PATH = CONFIG_DIR / "defaults.yaml"
DEFAULT_RUN_CONFIG = CONFIG_DIR / "cartpole.yaml"

# Inclusive/exclusive numeric bounds per key: (low, low_inclusive, high, high_inclusive); None = unbounded.
# A list-valued key's bounds apply to each of its items.
_BOUNDS: dict[str, tuple[float | None, bool, float | None, bool]] = {
    **{f"trainer.{k}": (1, True, None, False) for k in (
        "num_workers", "batch_size", "minibatch_size", "bptt_horizon", "update_epochs",
        "forward_pass_minibatch_target_size", "async_factor", "total_timesteps")},
    "trainer.gamma": (0.0, False, 1.0, True),
    "trainer.gae_lambda": (0.0, True, 1.0, True),
    "trainer.clip_coef": (0.0, False, None, False),
    "trainer.ent_coef": (0.0, True, None, False),
    "trainer.vf_coef": (0.0, True, None, False),
    "trainer.vf_clip_coef": (0.0, False, None, False),
    "trainer.max_grad_norm": (0.0, False, None, False),
    "trainer.prio_alpha": (0.0, True, None, False),
    "trainer.prio_beta0": (0.0, True, 1.0, True),
    "trainer.vtrace_rho_clip": (0.0, False, None, False),
    "trainer.vtrace_c_clip": (0.0, False, None, False),
    "trainer.learning_rate": (0.0, False, None, False),
    "trainer.min_learning_rate": (0.0, True, None, False),
    "trainer.adam_eps": (0.0, False, None, False),
    "trainer.min_ent_coef": (0.0, True, None, False),
    "trainer.min_clip_coef": (0.0, False, None, False),
    "trainer.log_schedule_decay": (0.0, True, None, False),
    "trainer.weight_decay": (0.0, True, None, False),
    "trainer.gradient_accumulation": (1, True, None, False),
    "trainer.kl_divergence_coef_rho": (0.0, True, None, False),
    "trainer.coef_rho_decay": (0.0, True, 1.0, True),
    "trainer.ref_update_interval": (1, True, None, False),
    "trainer.vf_warmup": (0, True, None, False),
    "trainer.max_policy_lag": (0, True, None, False),
    "trainer.target_kl": (0.0, False, None, False),
    "trainer.entropy_floor": (0.0, False, None, False),
    "env.num_agents": (1, True, None, False),
    "selfplay.opponent_pool_size": (1, True, None, False),
    "selfplay.opponent_pool_beta": (0.0, False, 1.0, True),
    "selfplay.opponent_pool_exploration": (0.0, True, 1.0, True),
    "selfplay.snapshot_interval": (1, True, None, False),
    "selfplay.alternation_steps": (1, True, None, False),
    "selfplay.cache_size": (1, True, None, False),
    "env.obs_width": (1, True, None, False),
    "env.obs_height": (1, True, None, False),
    "env.step_timeout_s": (0.1, True, None, False),
    "run.checkpoint_interval": (1, True, None, False),
    "run.keep_checkpoints": (1, True, None, False),
    "run.torch_threads": (1, True, None, False),
    "run.stall_factor": (1.0, True, None, False),
    "run.stall_min_s": (0.0, False, None, False),
    "model.hidden_size": (1, True, None, False),
    "model.num_layers": (1, True, None, False),
    "model.cnn_channels": (1, True, None, False),
    "network.port": (1, True, 65532, True),
    "network.metrics_port": (0, True, 65535, True),
    "network.heartbeat_interval_s": (0.0, False, None, False),
    "network.peer_timeout_s": (0.0, False, None, False),
    "network.rows_per_message": (1, True, None, False),
    "network.send_queue_messages": (1, True, None, False),
    "network.max_message_bytes": (1024, True, None, False),
    "network.max_abs_value": (0.0, False, None, False),
    "network.socket_buffer_bytes": (4096, True, None, False),
    "coma.actor_lr": (0.0, False, None, False),
    "coma.critic_lr": (0.0, False, None, False),
    "coma.gamma": (0.0, False, 1.0, True),
    "coma.tau": (0.0, False, 1.0, True),
    **{f"coma.{k}": (1, True, None, False) for k in (
        "batch_size", "epochs", "rollout_length", "buffer_size", "hidden_sizes", "counterfactual_samples")},
    "coma.max_grad_norm": (0.0, False, None, False),
    "coma.max_importance_weight": (0.0, False, None, False),
    "coma.max_importance_weight_negative": (0.0, False, None, False),
    "coma.entropy_coef": (0.0, True, None, False),
    "evaluation.interval_updates": (0, True, None, False),
    "evaluation.gate_games": (0, True, None, False),
    "evaluation.games": (2, True, None, False),
}


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
    _check_selfplay(config, source)
    _check_coma(config, source)
    _check_evaluation(config, source)
    return config


def _check_selfplay(config: RunConfig, source: str) -> None:
    """Self-play needs an env with opponents to seat and a feed-forward policy (opponents keep no state)."""
    if not config.selfplay.enabled:
        return
    if config.env.num_agents < 2:
        raise ConfigError(f"{source}: selfplay.enabled needs env.num_agents >= 2 (one learner seat and at least one "
                          f"opponent seat per env), got {config.env.num_agents}")
    if config.model.core != "mlp":
        raise ConfigError(f"{source}: selfplay.enabled needs model.core: mlp (opponent snapshots keep no recurrent "
                          f"state yet), got {config.model.core!r}")
    _check_baseline_opponents(config, source)


def _check_baseline_opponents(config: RunConfig, source: str) -> None:
    """selfplay.baseline_opponents: known baseline names of a two-player env, each chance in (0, 1], sum <= 1."""
    mix = config.selfplay.baseline_opponents
    if not mix:
        return
    if config.env.name not in BASELINE_ENVS:
        raise ConfigError(f"{source}: selfplay.baseline_opponents needs an env with baselines; env.name "
                          f"{config.env.name!r} has none (allowed: {', '.join(BASELINE_ENVS)}), or leave it empty")
    for name, chance in mix.items():
        if not isinstance(name, str) or baseline_strength(name) is None:
            raise ConfigError(f"{source}: selfplay.baseline_opponents: unknown baseline {name!r}; allowed: "
                              f"{BASELINE_FORMS}")
        if isinstance(chance, bool) or not isinstance(chance, (int, float)) or not 0 < chance <= 1:
            raise ConfigError(f"{source}: selfplay.baseline_opponents.{name}: the chance an env draws it must be a "
                              f"number in (0, 1], got {chance!r}")
    if sum(mix.values()) > 1 + 1e-9:
        raise ConfigError(f"{source}: selfplay.baseline_opponents: the chances add up to {sum(mix.values()):g}, "
                          f"more than 1 (what is left over is drawn from the pool)")


def _check_coma(config: RunConfig, source: str) -> None:
    """COMA learns from rollouts of coma.rollout_length env steps (the learner's batch), with feed-forward actors,
    no opponents and in float32 (trainer.autocast none)."""
    if config.trainer.algorithm != "coma":
        return
    if config.coma.max_importance_weight_negative < config.coma.max_importance_weight:
        raise ConfigError(f"{source}: coma.max_importance_weight_negative ({config.coma.max_importance_weight_negative}) "
                          f"must be >= coma.max_importance_weight ({config.coma.max_importance_weight}); set it to at "
                          f"least {config.coma.max_importance_weight} (equal: one cap for both signs of advantage)")
    if config.trainer.batch_size != config.coma.rollout_length:
        raise ConfigError(f"{source}: trainer.algorithm coma collects a rollout per update: trainer.batch_size "
                          f"({config.trainer.batch_size} env steps) must equal coma.rollout_length "
                          f"({config.coma.rollout_length})")
    if config.selfplay.enabled:
        raise ConfigError(f"{source}: trainer.algorithm coma is for cooperative teams; selfplay.enabled must be false")
    if config.model.core != "mlp":
        raise ConfigError(f"{source}: trainer.algorithm coma runs feed-forward actors (coma.hidden_sizes); model.core "
                          f"must be mlp, got {config.model.core!r}")
    if config.trainer.autocast != "none":
        raise ConfigError(f"{source}: trainer.autocast {config.trainer.autocast!r} applies to PPO's update only; "
                          f"trainer.algorithm coma trains in float32, so trainer.autocast must be none")


def _check_evaluation(config: RunConfig, source: str) -> None:
    """Evaluation during training plays pool snapshots (self-play) against the baselines of a two-player env."""
    section = config.evaluation
    if section.games % 2:
        raise ConfigError(f"{source}: evaluation.games must be even (each seat played equally often), "
                          f"got {section.games}")
    if section.gate_games % 2:
        raise ConfigError(f"{source}: evaluation.gate_games must be even (each seat played equally often), "
                          f"got {section.gate_games}")
    for name in section.baselines:
        if baseline_strength(name) is None:
            raise ConfigError(f"{source}: evaluation.baselines: unknown baseline {name!r}; allowed: {BASELINE_FORMS}")
    if len(set(section.baselines)) != len(section.baselines):
        raise ConfigError(f"{source}: evaluation.baselines names a baseline twice: {section.baselines}")
    if section.interval_updates == 0:
        return
    if config.env.name not in BASELINE_ENVS:
        raise ConfigError(f"{source}: evaluation.interval_updates > 0 needs a two-player env with baselines; "
                          f"env.name {config.env.name!r} has none (allowed: {', '.join(BASELINE_ENVS)}), "
                          f"or set evaluation.interval_updates: 0")
    if not config.selfplay.enabled:
        raise ConfigError(f"{source}: evaluation.interval_updates > 0 evaluates the opponent pool's snapshots: "
                          f"selfplay.enabled must be true (or set evaluation.interval_updates: 0)")


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
        return {}
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
    hints = typing.get_type_hints(cls)
    allowed = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in values.items():
        if key not in allowed:
            raise ConfigError(_unknown(f"{section_name}.{key}", key, allowed, source))
        dotted = f"{section_name}.{key}"
        kwargs[key] = _check_value(dotted, hints[key], value)
    return cls(**kwargs)


def _check_value(dotted: str, hint: Any, value: Any) -> Any:
    optional = type(None) in typing.get_args(hint)
    base = next((a for a in typing.get_args(hint) if a is not type(None)), hint) if optional else hint
    if value is None:
        if optional:
            return None
        raise ConfigError(f"{dotted}: a value is required ({_describe(base)}), got null")
    origin = typing.get_origin(base) or base
    if origin is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{dotted}: expected true or false, got {value!r}")
        return value
    if origin is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{dotted}: expected an integer, got {value!r}")
    elif origin is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ConfigError(f"{dotted}: expected a finite number, got {value!r}")
        value = float(value)
    elif origin is str:
        if not isinstance(value, str):
            raise ConfigError(f"{dotted}: expected a string, got {value!r}")
        choices = CHOICES.get(dotted)
        if choices is not None and value not in choices:
            raise ConfigError(f"{dotted}: {value!r} is not allowed; allowed: {', '.join(choices)}")
        return value
    elif origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{dotted}: expected a mapping, got {value!r}")
        return dict(value)
    elif origin is list:
        (item_hint,) = typing.get_args(base)
        if not isinstance(value, list) or not value:
            raise ConfigError(f"{dotted}: expected a non-empty list (each item {_describe(item_hint)}), "
                              f"got {value!r}")
        return [_check_value(dotted, item_hint, item) for item in value]
    _check_bounds(dotted, value)
    return value


def _check_bounds(dotted: str, value: float) -> None:
    bounds = _BOUNDS.get(dotted)
    if bounds is None:
        return
    low, low_inc, high, high_inc = bounds
    too_low = low is not None and (value < low or (value == low and not low_inc))
    too_high = high is not None and (value > high or (value == high and not high_inc))
    if too_low or too_high:
        left = "unbounded" if low is None else f"{'>=' if low_inc else '>'} {low}"
        right = "" if high is None else f" and {'<=' if high_inc else '<'} {high}"
        raise ConfigError(f"{dotted}: {value!r} is out of range; allowed: {left}{right}")


def _describe(hint: Any) -> str:
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(hint, str(hint))
