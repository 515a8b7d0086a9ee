"""The env tables: ``configs.env_config.ENV_NAMES`` (configs sits below envs and cannot read the tables) names
exactly the built-in envs of ``envs.builtin.table`` and the adapters of ``envs.adapters.table``, so the two lists
cannot drift; and each built-in entry's declared spec is the spec of the env it builds."""

from __future__ import annotations

import pytest

from configs.env_config import ENV_NAMES, EnvConfig
from envs.adapters.table import ADAPTERS
from envs.builtin.table import BUILTIN_ENVS

AGENTS = {"connect_four": 2}
"""num_agents for the built-in envs that need more than 1."""


def test_env_names_are_the_builtin_envs_and_the_adapters():
    assert len(set(ENV_NAMES)) == len(ENV_NAMES), "no name twice"
    assert not set(BUILTIN_ENVS) & set(ADAPTERS), "a name is a built-in env or an adapter, not both"
    assert set(ENV_NAMES) == set(BUILTIN_ENVS) | set(ADAPTERS), \
        "configs.env_config.EnvName must list envs.builtin.table.BUILTIN_ENVS and envs.adapters.table.ADAPTERS"


@pytest.mark.parametrize("name", sorted(BUILTIN_ENVS))
def test_a_builtin_entry_declares_the_spec_it_builds(name):
    cfg = EnvConfig(name=name, num_agents=AGENTS.get(name, 1))
    entry = BUILTIN_ENVS[name]
    env = entry.make(cfg, 2)
    try:
        assert env.num_envs == 2
        assert env.spec == entry.spec(cfg)
    finally:
        env.close()
