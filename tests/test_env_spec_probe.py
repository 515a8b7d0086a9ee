"""envs.registry.probe_env_spec: a built-in env's spec is declared; an external env is built only in a child.

The learner reads its env's spec this way, so a user's env never runs in the learner's own process.
"""

from __future__ import annotations

import os
import re
import sys
import time

import pytest

from configs.env_config import EnvConfig
from envs.builtin.cartpole import CartPoleVec
from envs.errors import EnvConfigError, EnvRaised
from envs import registry
from envs.registry import env_spec, probe_env_spec
from tests.processes import descendants

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


def test_env_that_hangs_while_built_is_said_as_it_goes_then_stopped_at_the_build_deadline(monkeypatch):
    monkeypatch.setattr(registry, "BUILD_NOTICE_S", 0.5)
    notes: list[str] = []
    cfg = EnvConfig(name="native", entry_point="tests.faulty_envs:HangsInBuild", build_timeout_s=3.0)
    started = time.monotonic()
    with pytest.raises(EnvConfigError, match=r"^env 'native:tests\.faulty_envs:HangsInBuild': building it to read its "
                                             r"spec took longer than env\.build_timeout_s \(3 s\); its constructor "
                                             r"hangs, or it needs a larger env\.build_timeout_s$"):
        probe_env_spec(cfg, note=notes.append)
    assert 3.0 <= time.monotonic() - started < 20.0
    assert len(notes) >= 2 and all(re.fullmatch(r"building env 'native:tests\.faulty_envs:HangsInBuild' to read its "
                                                r"spec: \d+ s so far \(env\.build_timeout_s 3\)", n) for n in notes)
    assert not descendants(os.getpid())  # the child was killed and reaped


def test_env_that_raises_timeout_error_is_its_own_error_at_once_not_a_hang():
    cfg = EnvConfig(name="native", entry_point="tests.faulty_envs:TimesOutInConstructor", build_timeout_s=60.0)
    started = time.monotonic()
    with pytest.raises(EnvRaised, match="license server did not answer"):
        probe_env_spec(cfg)
    assert time.monotonic() - started < 30.0
