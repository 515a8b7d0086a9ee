"""Where config rules live: ranges and choices on the fields' types, rules over several keys in configs.rules.RULES.

A rule names the keys it reads; these tests check every name is a real field (so a renamed field cannot silently
drop a check), that each rule's message is produced word for word, and that the markers sit where they can work.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

import configs.rules as rules
from configs.env_config import ENV_NAMES, EnvConfig
from configs.field_rules import Range
from configs.loader import ConfigError, load_config
from configs.rules import RULES, Rule, first_problem, unknown_keys, values_for
from configs.schema import (ALGORITHMS, AUTOCAST_MODES, COMA_DEFAULT_ACTIONS, COMPILE_MODES, DEVICES, MODEL_CORES,
                            MODEL_ENCODERS, OPTIMIZERS, SCHEDULES, SECTIONS, ComaSection, ModelSection, RunConfig,
                            RunSection, TrainerSection)

DEFAULTS = Path(__file__).resolve().parents[1] / "configs" / "defaults.yaml"
BASELINE_FORMS = ("random, one_ply, negamax-<depth> (depth an integer >= 1; one_ply and negamax connect_four only) "
                  "or an entry point module.path:callable (called as fn(seed=<int>), returning a player)")
PLAYERS = ["selfplay.enabled=true", "env.num_agents=2", "env.name=connect_four"]
AEC = ["selfplay.enabled=true", "env.num_agents=2", "env.name=pettingzoo_aec",
       "env.entry_point=pettingzoo.classic.tictactoe_v3:env"]
ONE_PLY_ON_AEC = ("baseline 'one_ply' plays env.name 'connect_four' only, not 'pettingzoo_aec'; use random or an entry "
                  "point module.path:callable returning a player for it")
COMA = ["trainer.algorithm=coma", "trainer.batch_size=2000"]

BROKEN = [
    (["selfplay.enabled=true"],
     "selfplay.enabled needs env.num_agents >= 2 (one learner seat and at least one opponent seat per env), got 1"),
    (["selfplay.enabled=true", "env.num_agents=2", "model.core=lstm"],
     "selfplay.enabled needs model.core: mlp (opponent snapshots keep no recurrent state yet), got 'lstm'"),
    (["selfplay.enabled=true", "env.num_agents=2", "selfplay.baseline_opponents={one_ply: 0.5}"],
     "selfplay.baseline_opponents needs an env with baselines; env.name 'cartpole' has none (allowed: connect_four, "
     "pettingzoo_aec), or leave it empty"),
    ([*PLAYERS, "selfplay.baseline_opponents={bogus: 0.5}"],
     f"selfplay.baseline_opponents: unknown baseline 'bogus'; allowed: {BASELINE_FORMS}"),
    ([*AEC, "selfplay.baseline_opponents={one_ply: 0.5}"], f"selfplay.baseline_opponents: {ONE_PLY_ON_AEC}"),
    ([*AEC, "selfplay.baseline_opponents={pkg-x:make: 0.5}"],
     f"selfplay.baseline_opponents: unknown baseline 'pkg-x:make'; allowed: {BASELINE_FORMS}"),
    ([*PLAYERS, "selfplay.baseline_opponents={one_ply: 0}"],
     "selfplay.baseline_opponents.one_ply: the chance an env draws it must be a number in (0, 1], got 0"),
    ([*PLAYERS, "selfplay.baseline_opponents={one_ply: 0.7, random: 0.7}"],
     "selfplay.baseline_opponents: the chances add up to 1.4, more than 1 (what is left over is drawn from the pool)"),
    ([*COMA, "coma.max_importance_weight=4"],
     "coma.max_importance_weight_negative (3.0) must be >= coma.max_importance_weight (4.0); set it to at least 4.0 "
     "(equal: one cap for both signs of advantage)"),
    (["trainer.algorithm=coma"],
     "trainer.algorithm coma collects a rollout per update: trainer.batch_size (524288 env steps) must equal "
     "coma.rollout_length (2000)"),
    ([*COMA, "selfplay.enabled=true", "env.num_agents=2"],
     "trainer.algorithm coma is for cooperative teams; selfplay.enabled must be false"),
    ([*COMA, "model.core=lstm"],
     "trainer.algorithm coma runs feed-forward actors (coma.hidden_sizes); model.core must be mlp, got 'lstm'"),
    ([*COMA, "trainer.autocast=bf16"],
     "trainer.autocast 'bf16' applies to PPO's update only; trainer.algorithm coma trains in float32, so "
     "trainer.autocast must be none"),
    (["evaluation.games=3"], "evaluation.games must be even (each seat played equally often), got 3"),
    (["evaluation.gate_games=1"], "evaluation.gate_games must be even (each seat played equally often), got 1"),
    (["evaluation.baselines=[negamax-0]"], f"evaluation.baselines: unknown baseline 'negamax-0'; allowed: {BASELINE_FORMS}"),
    (["evaluation.baselines=[one_ply, one_ply]"], "evaluation.baselines names a baseline twice: ['one_ply', 'one_ply']"),
    (["evaluation.interval_updates=1"],
     "evaluation.interval_updates > 0 needs a two-player env with baselines; env.name 'cartpole' has none (allowed: "
     "connect_four, pettingzoo_aec), or set evaluation.interval_updates: 0"),
    ([*AEC, "evaluation.interval_updates=1"], f"evaluation.baselines: {ONE_PLY_ON_AEC}"),
    ([*AEC, "env.num_agents=3", "evaluation.interval_updates=1", "evaluation.baselines=[random]"],
     "evaluation.interval_updates > 0 plays two-player games (evaluation.arena): env.name 'pettingzoo_aec' needs "
     "env.num_agents: 2 (a two-player AEC env), got 3"),
    (["evaluation.interval_updates=1", "env.name=connect_four"],
     "evaluation.interval_updates > 0 evaluates the opponent pool's snapshots: selfplay.enabled must be true (or set "
     "evaluation.interval_updates: 0)"),
    (["env.tokens.num_locations=9", "env.tokens.pad_value=255"],
     "env.tokens declares a token layout with exactly the keys num_locations, num_features, pad_value; got "
     "num_locations, pad_value (per key of a Dict observation: {<key>: {num_locations, num_features, pad_value}, "
     "...})"),
    (["env.tokens.grid.num_locations=9", "env.tokens.grid.pad_value=255"],
     "env.tokens.grid declares the token layout of the observation's key 'grid' with exactly the keys "
     "num_locations, num_features, pad_value; got num_locations, pad_value"),
]
"""Overrides on defaults.yaml that break one rule, and that rule's message (the loader puts "config: " in front)."""


def _field_names() -> set[str]:
    return {f"{section}.{f.name}" for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)}


def _never(values: rules.Values) -> str | None:
    return None


# ---------------------------------------------------------------- rules name real fields


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.check.__name__)
def test_every_key_a_rule_names_is_a_field_of_a_section(rule):
    assert rule.keys and not unknown_keys(rule), f"{rule.check.__name__} names keys that are no field: {unknown_keys(rule)}"
    assert set(rule.keys) <= _field_names()


def test_a_misspelled_key_is_caught():
    assert unknown_keys(Rule(keys=("selfplay.enabeld", "env.name"), check=_never)) == ["selfplay.enabeld"]
    assert unknown_keys(Rule(keys=("envs.name", "selfplay", "env.name.inner"), check=_never)) == [
        "envs.name", "selfplay", "env.name.inner"]
    assert unknown_keys(Rule(keys=("env.name", "trainer.autocast"), check=_never)) == []


def test_a_check_is_handed_exactly_the_keys_its_rule_names():
    config = RunConfig(env=EnvConfig(name="connect_four", num_agents=2))
    assert values_for(config, ("env.name", "env.num_agents", "selfplay.enabled")) == {
        "env.name": "connect_four", "env.num_agents": 2, "selfplay.enabled": False}
    for rule in RULES:  # a check that reads a key its rule does not name fails on every config
        rule.check(values_for(config, rule.keys))


# ---------------------------------------------------------------- each rule's message, word for word


@pytest.mark.parametrize("overrides, message", BROKEN, ids=[" ".join(o) for o, _ in BROKEN])
def test_a_broken_rule_names_the_keys_word_for_word(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_config(DEFAULTS, overrides)
    assert str(info.value) == f"config: {message}"


def test_every_rule_is_broken_by_one_of_the_cases(monkeypatch):
    monkeypatch.setattr(rules, "RULES", ())  # load the broken configs without the rules, then run them here
    first_broken = set()
    for overrides, message in BROKEN:
        config = load_config(DEFAULTS, overrides)
        broken = [i for i, rule in enumerate(RULES) if rule.check(values_for(config, rule.keys)) is not None]
        assert broken and RULES[broken[0]].check(values_for(config, RULES[broken[0]].keys)) == message
        first_broken.add(broken[0])
    assert first_broken == set(range(len(RULES)))


def test_the_shipped_defaults_break_no_rule():
    assert first_problem(RunConfig()) is None


# ---------------------------------------------------------------- markers on the fields


def _markers(hint: typing.Any) -> list[tuple[typing.Any, typing.Any]]:
    """(marker, the type it annotates) for every Range or Literal in ``hint``, at any depth."""
    found = []
    if typing.get_origin(hint) is typing.Annotated:
        base, *extras = typing.get_args(hint)
        found += [(extra, base) for extra in extras] + _markers(base)
    elif typing.get_origin(hint) is typing.Literal:
        found.append((hint, str))
    else:
        for arg in typing.get_args(hint):
            found += _markers(arg)
    return found


def test_ranges_sit_on_numbers_and_choices_are_strings():
    ranges = 0
    for section, cls in SECTIONS.items():
        for key, hint in typing.get_type_hints(cls, include_extras=True).items():
            for marker, base in _markers(hint):
                if isinstance(marker, Range):
                    ranges += 1
                    assert base in (int, float), f"{section}.{key}: a Range on {base} is never checked"
                    assert isinstance(marker.low, base) or marker.low is None, f"{section}.{key}: write low as {base}"
                else:
                    assert all(isinstance(choice, str) for choice in typing.get_args(marker)), f"{section}.{key}"
    assert ranges >= 70  # the bounds that were a table of strings in configs/loader.py (78 keys)


def test_shared_choice_tuples_are_the_fields_literals():
    def choices(cls: type, key: str) -> tuple[str, ...]:
        return typing.get_args(typing.get_type_hints(cls)[key])

    assert choices(EnvConfig, "name") == ENV_NAMES
    assert choices(RunSection, "device") == DEVICES == ("auto", "cpu", "cuda")
    assert choices(TrainerSection, "algorithm") == ALGORITHMS == ("ppo", "coma")
    assert choices(TrainerSection, "autocast") == AUTOCAST_MODES == ("none", "bf16")
    assert choices(TrainerSection, "optimizer") == OPTIMIZERS
    assert choices(TrainerSection, "compile_mode") == COMPILE_MODES
    for key in ("lr_schedule", "ent_coef_schedule", "clip_coef_schedule"):
        assert choices(TrainerSection, key) == SCHEDULES
    assert choices(ModelSection, "core") == MODEL_CORES
    assert choices(ModelSection, "encoder") == MODEL_ENCODERS == ("auto", "mlp", "cnn", "tokens")
    assert choices(ComaSection, "default_action") == COMA_DEFAULT_ACTIONS


def test_a_range_describes_itself_as_the_messages_do():
    unit = Range(low=0.0, high=1.0, low_inclusive=False)
    assert unit.describe() == "> 0.0 and <= 1.0"
    assert not unit.allows(0.0) and unit.allows(1e-9) and unit.allows(1.0) and not unit.allows(1.0 + 1e-9)
    assert Range(low=1).describe() == ">= 1" and Range(low=1).allows(1) and not Range(low=1).allows(0)
    assert Range(high=5, high_inclusive=False).describe() == "unbounded and < 5"
    assert not Range(high=5, high_inclusive=False).allows(5)


def test_a_range_on_a_list_item_bounds_each_item():
    with pytest.raises(ConfigError, match=r"^model.cnn_channels: 0 is out of range; allowed: >= 1$"):
        load_config(DEFAULTS, ["model.cnn_channels=[16, 0]"])
    assert load_config(DEFAULTS, ["model.cnn_channels=[1, 2]"]).model.cnn_channels == [1, 2]
