"""Config rules beyond one field's type, range and allowed strings: every one in ``RULES``, each naming the dotted
keys it reads.

A field's own type, range and allowed strings sit on the field (``configs.field_rules``); what ties keys together
(self-play needs two seats, COMA's batch is its rollout, evaluation needs self-play) or looks inside a value (even
game counts, known baseline names) is here. ``configs.loader`` runs every rule, in order, on each ``RunConfig`` it
builds. A rule's check is handed only the keys its rule names, so the names cannot drift from what it reads, and
tests/test_config_rules.py checks that each is a real field of a section.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from configs.baselines import BASELINE_FORMS, TWO_PLAYER_ENVS, baseline_env_problem, is_baseline_name
from configs.schema import SECTIONS, RunConfig

Values = Mapping[str, Any]
"""What a check sees: each key its rule names ("section.key") -> that key's value in the config."""


@dataclass(frozen=True, kw_only=True)
class Rule:
    """One check over several config values."""

    keys: tuple[str, ...]
    """The "section.key" names the check reads; it is handed exactly these."""
    check: Callable[[Values], str | None]
    """The problem, as a message naming the keys and what is allowed (the loader puts the source in front), or None."""


def values_for(config: RunConfig, keys: tuple[str, ...]) -> dict[str, Any]:
    """``{"section.key": value}`` for each of ``keys`` in ``config``."""
    found = {}
    for key in keys:
        section, _, name = key.partition(".")
        found[key] = getattr(getattr(config, section), name)
    return found


def unknown_keys(rule: Rule) -> list[str]:
    """The keys ``rule`` names that are not a field of a ``RunConfig`` section (a rule that names one never loads)."""
    fields = {f"{section}.{f.name}" for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
    return [key for key in rule.keys if key not in fields]


def first_problem(config: RunConfig) -> str | None:
    """The message of the first rule in ``RULES`` that ``config`` breaks, or None."""
    for rule in RULES:
        problem = rule.check(values_for(config, rule.keys))
        if problem is not None:
            return problem
    return None


# ---------------------------------------------------------------- self-play: seats to fill, stateless opponents


def _selfplay_seats(v: Values) -> str | None:
    if v["selfplay.enabled"] and v["env.num_agents"] < 2:
        return (f"selfplay.enabled needs env.num_agents >= 2 (one learner seat and at least one opponent seat per "
                f"env), got {v['env.num_agents']}")
    return None


def _selfplay_core(v: Values) -> str | None:
    if v["selfplay.enabled"] and v["model.core"] != "mlp":
        return (f"selfplay.enabled needs model.core: mlp (opponent snapshots keep no recurrent state yet), "
                f"got {v['model.core']!r}")
    return None


def _baseline_opponents_env(v: Values) -> str | None:
    if v["selfplay.enabled"] and v["selfplay.baseline_opponents"] and v["env.name"] not in TWO_PLAYER_ENVS:
        return (f"selfplay.baseline_opponents needs an env with baselines; env.name {v['env.name']!r} has none "
                f"(allowed: {', '.join(TWO_PLAYER_ENVS)}), or leave it empty")
    return None


def _baseline_opponents_mix(v: Values) -> str | None:
    """Known baseline names the env can play, each chance in (0, 1], the chances summing to at most 1."""
    mix = v["selfplay.baseline_opponents"]
    if not v["selfplay.enabled"] or not mix:
        return None
    for name, chance in mix.items():
        if not is_baseline_name(name):
            return f"selfplay.baseline_opponents: unknown baseline {name!r}; allowed: {BASELINE_FORMS}"
        problem = baseline_env_problem(name, v["env.name"])
        if problem is not None:
            return f"selfplay.baseline_opponents: {problem}"
        if isinstance(chance, bool) or not isinstance(chance, (int, float)) or not 0 < chance <= 1:
            return (f"selfplay.baseline_opponents.{name}: the chance an env draws it must be a number in (0, 1], "
                    f"got {chance!r}")
    if sum(mix.values()) > 1 + 1e-9:
        return (f"selfplay.baseline_opponents: the chances add up to {sum(mix.values()):g}, more than 1 (what is "
                f"left over is drawn from the pool)")
    return None


# ---------------------------------------------------------------- COMA: rollouts as batches, feed-forward, float32


def _coma_importance_caps(v: Values) -> str | None:
    low, high = v["coma.max_importance_weight"], v["coma.max_importance_weight_negative"]
    if v["trainer.algorithm"] == "coma" and high < low:
        return (f"coma.max_importance_weight_negative ({high}) must be >= coma.max_importance_weight ({low}); set it "
                f"to at least {low} (equal: one cap for both signs of advantage)")
    return None


def _coma_batch_is_rollout(v: Values) -> str | None:
    if v["trainer.algorithm"] == "coma" and v["trainer.batch_size"] != v["coma.rollout_length"]:
        return (f"trainer.algorithm coma collects a rollout per update: trainer.batch_size "
                f"({v['trainer.batch_size']} env steps) must equal coma.rollout_length ({v['coma.rollout_length']})")
    return None


def _coma_no_selfplay(v: Values) -> str | None:
    if v["trainer.algorithm"] == "coma" and v["selfplay.enabled"]:
        return "trainer.algorithm coma is for cooperative teams; selfplay.enabled must be false"
    return None


def _coma_core(v: Values) -> str | None:
    if v["trainer.algorithm"] == "coma" and v["model.core"] != "mlp":
        return (f"trainer.algorithm coma runs feed-forward actors (coma.hidden_sizes); model.core must be mlp, "
                f"got {v['model.core']!r}")
    return None


def _coma_float32(v: Values) -> str | None:
    if v["trainer.algorithm"] == "coma" and v["trainer.autocast"] != "none":
        return (f"trainer.autocast {v['trainer.autocast']!r} applies to PPO's update only; trainer.algorithm coma "
                f"trains in float32, so trainer.autocast must be none")
    return None


# ---------------------------------------------------------------- evaluation: pool snapshots against baselines


def _even_games(key: str) -> Callable[[Values], str | None]:
    def check(v: Values) -> str | None:
        if v[key] % 2:
            return f"{key} must be even (each seat played equally often), got {v[key]}"
        return None
    return check


def _evaluation_baselines(v: Values) -> str | None:
    baselines = v["evaluation.baselines"]
    for name in baselines:
        if not is_baseline_name(name):
            return f"evaluation.baselines: unknown baseline {name!r}; allowed: {BASELINE_FORMS}"
    if len(set(baselines)) != len(baselines):
        return f"evaluation.baselines names a baseline twice: {baselines}"
    return None


def _evaluation_env(v: Values) -> str | None:
    if v["evaluation.interval_updates"] and v["env.name"] not in TWO_PLAYER_ENVS:
        return (f"evaluation.interval_updates > 0 needs a two-player env with baselines; env.name {v['env.name']!r} "
                f"has none (allowed: {', '.join(TWO_PLAYER_ENVS)}), or set evaluation.interval_updates: 0")
    return None


def _evaluation_baselines_env(v: Values) -> str | None:
    if not v["evaluation.interval_updates"]:
        return None  # the default baselines are Connect Four's: checked only where they are played
    for name in v["evaluation.baselines"]:
        problem = baseline_env_problem(name, v["env.name"])
        if problem is not None:
            return f"evaluation.baselines: {problem}"
    return None


def _two_player_matches(v: Values) -> str | None:
    """The arena plays two seats: a pettingzoo_aec env must have two agents (the registry checks env.num_agents
    against the env itself when it is built)."""
    if v["evaluation.interval_updates"] and v["env.name"] == "pettingzoo_aec" and v["env.num_agents"] != 2:
        return (f"evaluation.interval_updates > 0 plays two-player games (evaluation.arena): env.name "
                f"'pettingzoo_aec' needs env.num_agents: 2 (a two-player AEC env), got {v['env.num_agents']}")
    return None


def _evaluation_selfplay(v: Values) -> str | None:
    if v["evaluation.interval_updates"] and not v["selfplay.enabled"]:
        return ("evaluation.interval_updates > 0 evaluates the opponent pool's snapshots: selfplay.enabled must be "
                "true (or set evaluation.interval_updates: 0)")
    return None


# ---------------------------------------------------------------- env: a declared token layout

TOKEN_KEYS = ("num_locations", "num_features", "pad_value")
"""The keys of env.tokens (envs.base.TokenLayout's fields)."""


def _token_layout_keys(v: Values) -> str | None:
    tokens = v["env.tokens"]
    if tokens and all(isinstance(layout, dict) for layout in tokens.values()):  # {<dict key>: layout, ...}
        for key, layout in tokens.items():
            if set(layout) != set(TOKEN_KEYS):
                return (f"env.tokens.{key} declares the token layout of the observation's key {key!r} with exactly "
                        f"the keys {', '.join(TOKEN_KEYS)}; got {', '.join(sorted(layout)) or 'none'}")
        return None
    if tokens and set(tokens) != set(TOKEN_KEYS):
        return (f"env.tokens declares a token layout with exactly the keys {', '.join(TOKEN_KEYS)}; got "
                f"{', '.join(sorted(tokens))} (per key of a Dict observation: {{<key>: {{{', '.join(TOKEN_KEYS)}}}, "
                f"...}})")
    return None


RULES: tuple[Rule, ...] = (
    Rule(keys=("selfplay.enabled", "env.num_agents"), check=_selfplay_seats),
    Rule(keys=("selfplay.enabled", "model.core"), check=_selfplay_core),
    Rule(keys=("selfplay.enabled", "selfplay.baseline_opponents", "env.name"), check=_baseline_opponents_env),
    Rule(keys=("selfplay.enabled", "selfplay.baseline_opponents", "env.name"), check=_baseline_opponents_mix),
    Rule(keys=("trainer.algorithm", "coma.max_importance_weight", "coma.max_importance_weight_negative"),
         check=_coma_importance_caps),
    Rule(keys=("trainer.algorithm", "trainer.batch_size", "coma.rollout_length"), check=_coma_batch_is_rollout),
    Rule(keys=("trainer.algorithm", "selfplay.enabled"), check=_coma_no_selfplay),
    Rule(keys=("trainer.algorithm", "model.core"), check=_coma_core),
    Rule(keys=("trainer.algorithm", "trainer.autocast"), check=_coma_float32),
    Rule(keys=("evaluation.games",), check=_even_games("evaluation.games")),
    Rule(keys=("evaluation.gate_games",), check=_even_games("evaluation.gate_games")),
    Rule(keys=("evaluation.baselines",), check=_evaluation_baselines),
    Rule(keys=("evaluation.interval_updates", "env.name"), check=_evaluation_env),
    Rule(keys=("evaluation.interval_updates", "evaluation.baselines", "env.name"), check=_evaluation_baselines_env),
    Rule(keys=("evaluation.interval_updates", "env.name", "env.num_agents"), check=_two_player_matches),
    Rule(keys=("evaluation.interval_updates", "selfplay.enabled"), check=_evaluation_selfplay),
    Rule(keys=("env.tokens",), check=_token_layout_keys),
)
"""Every cross-key config rule, in the order the loader runs them (the first broken one is reported)."""
