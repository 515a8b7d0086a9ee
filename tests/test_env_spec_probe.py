"""envs.registry.probe_env_spec: a built-in env's spec is declared; an external env is built only in a child.

The learner reads its env's spec this way, so a user's env never runs in the learner's own process.
"""

from __future__ import annotations

import os
import sys

import pytest

from configs.env_config import EnvConfig
from envs.builtin.cartpole import CartPoleVec
from envs.errors import EnvConfigError, EnvRaised
from envs.registry import env_spec, probe_env_spec

pytestmark = pytest.mark.integration


def test_builtin_spec_is_declared_without_a_child():
    assert probe_env_spec(EnvConfig(name="cartpole")) == CartPoleVec.SPEC


def test_external_spec_comes_from_a_child_and_nothing_is_imported_here(monkeypatch):
    cfg = EnvConfig(name="native", entry_point="examples.corridor:CorridorVec", kwargs={"num_agents": 2, "length": 8},
                    num_agents=2)
    monkeypatch.delitem(sys.modules, "examples.corridor", raising=False)  # restored after the test
    spec = probe_env_spec(cfg)
    assert "examples.corridor" not in sys.modules
    assert spec == env_spec(cfg)


def test_config_error_in_the_child_keeps_its_type_and_message():
    cfg = EnvConfig(name="native", entry_point="tests.faulty_envs:NoSuchEnv")
    with pytest.raises(EnvConfigError, match="has no attribute 'NoSuchEnv'"):
        probe_env_spec(cfg)


def test_env_that_raises_in_the_child_carries_the_users_traceback():
    cfg = EnvConfig(name="native", entry_point="tests.faulty_envs:BrokenConstructor")
    with pytest.raises(EnvRaised) as err:
        probe_env_spec(cfg)
    remote = err.value.__cause__
    while remote is not None and "faulty_envs.py" not in str(remote):
        remote = remote.__cause__
    assert remote is not None, "the child's traceback naming the user's file is chained to the error"


def test_env_that_kills_its_process_is_an_env_error_not_a_hang():
    cfg = EnvConfig(name="native", entry_point="tests.faulty_envs:DiesAtBirth")
    with pytest.raises(EnvRaised, match="died while building it"):
        probe_env_spec(cfg)
    assert os.getpid()  # still here
