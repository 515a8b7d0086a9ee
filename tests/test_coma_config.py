"""The coma config section and trainer.algorithm: seed defaults, and errors that name the key and what is allowed."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from configs.loader import ConfigError, config_to_dict, load_config
from configs.schema import ComaSection

REPO = Path(__file__).resolve().parents[1]


def config_error(*overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(None, list(overrides))
    return str(info.value)


def test_defaults_are_the_seeds():
    config = load_config(None)
    assert config.trainer.algorithm == "ppo"
    assert config.coma == ComaSection()
    coma = config.coma
    assert (coma.actor_lr, coma.critic_lr, coma.gamma, coma.tau) == (3e-4, 3e-4, 0.99, 0.005)
    assert (coma.batch_size, coma.epochs, coma.rollout_length, coma.buffer_size) == (64, 10, 2000, 100_000)
    assert (coma.max_grad_norm, coma.entropy_coef, coma.hidden_sizes) == (0.5, 0.0, [256, 256])
    assert (coma.parameter_sharing, coma.default_action, coma.counterfactual_samples) == (False, "zero", 8)
    assert (coma.max_importance_weight, coma.max_importance_weight_negative) == (1.0, 3.0)  # not the seed's: see README


def test_overrides_apply():
    config = load_config(None, ["trainer.algorithm=coma", "trainer.batch_size=2000", "coma.hidden_sizes=[64, 32, 16]", "coma.tau=1",
                                "coma.default_action=sampled", "coma.parameter_sharing=true"])
    assert config.trainer.algorithm == "coma" and config.coma.hidden_sizes == [64, 32, 16]
    assert config.coma.tau == 1.0 and config.coma.default_action == "sampled" and config.coma.parameter_sharing


def test_typo_names_the_key_and_the_allowed_keys():
    msg = config_error("coma.actr_lr=0.001")
    assert "unknown key 'coma.actr_lr'" in msg and "did you mean 'actor_lr'" in msg
    assert "allowed:" in msg and "critic_lr" in msg and "counterfactual_samples" in msg


@pytest.mark.parametrize(("override", "allowed"), [
    ("trainer.algorithm=sac", "allowed: ppo, coma"),
    ("coma.default_action=noop", "allowed: zero, mean, sampled"),
])
def test_bad_choice_names_the_allowed_values(override, allowed):
    msg = config_error(override)
    assert override.split("=")[0] in msg and allowed in msg


@pytest.mark.parametrize(("override", "allowed"), [
    ("coma.tau=0", "allowed: > 0.0 and <= 1.0"),
    ("coma.tau=1.5", "allowed: > 0.0 and <= 1.0"),
    ("coma.actor_lr=-0.001", "allowed: > 0.0"),
    ("coma.critic_lr=0", "allowed: > 0.0"),
    ("coma.gamma=1.01", "allowed: > 0.0 and <= 1.0"),
    ("coma.batch_size=0", "allowed: >= 1"),
    ("coma.buffer_size=0", "allowed: >= 1"),
    ("coma.counterfactual_samples=0", "allowed: >= 1"),
    ("coma.max_grad_norm=0", "allowed: > 0.0"),
    ("coma.entropy_coef=-1", "allowed: >= 0.0"),
    ("coma.hidden_sizes=[256, 0]", "allowed: >= 1"),
])
def test_out_of_range_names_the_key(override, allowed):
    msg = config_error(override)
    assert msg.startswith(override.split("=")[0] + ":") and "out of range" in msg and allowed in msg


@pytest.mark.parametrize(("override", "words"), [
    ("coma.hidden_sizes=[]", "expected a non-empty list"),
    ("coma.hidden_sizes=256", "expected a non-empty list"),
    ("coma.hidden_sizes=[256, 2.5]", "expected an integer"),
    ("coma.batch_size=6.5", "expected an integer"),
    ("coma.parameter_sharing=1", "expected true or false"),
])
def test_wrong_types_name_the_key(override, words):
    msg = config_error(override)
    assert msg.startswith("coma.") and override.split("=")[0] in msg and words in msg


@pytest.mark.integration
def test_print_config_shows_the_coma_section():
    done = subprocess.run([sys.executable, "-m", "learner", "--print-config", "--set", "coma.hidden_sizes=[32, 32]"],
                          cwd=REPO, capture_output=True, text=True, timeout=120, check=True)
    printed = yaml.safe_load(done.stdout)
    assert printed["coma"]["hidden_sizes"] == [32, 32] and printed["coma"]["default_action"] == "zero"
    assert printed["trainer"]["algorithm"] == "ppo"
    assert printed == config_to_dict(load_config(None, ["coma.hidden_sizes=[32, 32]"]))


def test_plan_shows_comas_update_not_ppos_minibatches(capsys):
    from learner.cli import main
    assert main(["--config", "coma_spread", "--set", "coma.batch_size=128", "--set", "coma.epochs=3", "--plan",
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert not {"num_minibatches", "gradient_updates_per_batch", "minibatch_segments"} & rows.keys()
    # 2000 env steps per update in minibatches of 128: ceil(2000 / 128) = 16 per epoch, 3 epochs.
    assert rows["coma_env_steps_per_update"] == 2000
    assert rows["coma_gradient_steps_per_update"] == 3 * 16
    assert rows["coma_replays_per_transition"] == math.ceil(48 * 128 / 2000)
    assert rows["coma_replay_capacity"] == 100_000
    assert main(["--config", "cartpole", "--plan", "--json"]) == 0
    assert "num_minibatches" in json.loads(capsys.readouterr().out)


def test_the_negative_advantage_cap_is_never_below_the_positive_one():
    msg = config_error("trainer.algorithm=coma", "trainer.batch_size=2000", "coma.max_importance_weight=2",
                       "coma.max_importance_weight_negative=1.5")
    assert "coma.max_importance_weight_negative (1.5) must be >= coma.max_importance_weight (2.0)" in msg
    assert "set it to at least 2.0" in msg
    assert config_error("coma.max_importance_weight_negative=0").startswith("coma.max_importance_weight_negative:")
