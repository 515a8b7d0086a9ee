"""env.tokens: a token layout declared in the config for an adapted env (examples/token_cue.py through Gymnasium's
vector API), its checks and their messages, and model.encoder auto picking the token encoder for it."""

from __future__ import annotations

import pytest

from configs.loader import ConfigError, load_config, resolve_config_path
from envs.base import TokenLayout
from envs.errors import EnvConfigError
from envs.registry import env_spec, make_vec_env, with_token_layout
from policies.encoders import encoder_kind

TOKENS = ["env.tokens.num_locations=121", "env.tokens.num_features=4", "env.tokens.pad_value=255"]


def test_the_shipped_token_config_declares_the_layout_and_auto_picks_the_token_encoder():
    config = load_config(resolve_config_path("token_cue"))
    spec = env_spec(config.env)
    assert spec.tokens == TokenLayout(num_locations=121, num_features=4, pad_value=255)
    assert encoder_kind(spec, config.model) == "tokens"
    env = make_vec_env(config.env, 3)
    try:
        assert env.spec.tokens == spec.tokens  # what the actor host builds carries it too
    finally:
        env.close()


def test_without_the_declaration_the_same_env_gets_the_flat_mlp():
    config = load_config(resolve_config_path("token_cue"), ["env.tokens={}"])
    spec = env_spec(config.env)
    assert spec.tokens is None and encoder_kind(spec, config.model) == "mlp"


def test_set_reaches_into_env_tokens_key_by_key():
    config = load_config(None, ["env.name=gymnasium_vector", "env.entry_point=examples.token_cue:make_vec", *TOKENS])
    assert config.env.tokens == {"num_locations": 121, "num_features": 4, "pad_value": 255}


def test_a_misspelled_or_missing_token_key_is_refused_naming_the_keys():
    with pytest.raises(ConfigError, match="env.tokens declares a token layout with exactly the keys num_locations, "
                                          "num_features, pad_value; got num_features, num_locatoins, pad_value"):
        load_config(None, ["env.tokens.num_locatoins=121", "env.tokens.num_features=4", "env.tokens.pad_value=255"])


def test_a_built_in_env_refuses_a_declared_token_layout():
    config = load_config(None, TOKENS)
    with pytest.raises(EnvConfigError, match="env.tokens declares the token layout of an adapted env; the built-in "
                                             "env 'cartpole' declares its own observations: drop env.tokens"):
        env_spec(config.env)


def test_observations_that_cannot_hold_the_layout_are_refused_naming_the_env():
    config = load_config(None, ["env.name=gymnasium", "env.gym_id=CartPole-v1", *TOKENS])
    with pytest.raises(EnvConfigError, match=r"env.tokens: env 'gymnasium:CartPole-v1': token observations must have "
                                             r"shape \[L, 3\]"):
        env_spec(config.env)


def test_a_pad_value_inside_the_locations_is_refused():
    config = load_config(None, ["env.name=gymnasium_vector", "env.entry_point=examples.token_cue:make_vec",
                                "env.tokens.num_locations=121", "env.tokens.num_features=4", "env.tokens.pad_value=3"])
    with pytest.raises(EnvConfigError, match="pad_value 3 is a real location"):
        env_spec(config.env)


def test_an_env_declaring_another_layout_itself_is_refused():
    config = load_config(None, ["env.name=native", "env.entry_point=tests.token_env:PaddedTokenVec",
                                "env.tokens.num_locations=100", "env.tokens.num_features=4",
                                "env.tokens.pad_value=255"])
    spec = env_spec(load_config(None, ["env.name=native", "env.entry_point=tests.token_env:PaddedTokenVec"]).env)
    with pytest.raises(EnvConfigError, match="declares its own token layout"):
        with_token_layout(config.env, spec)
