"""Agents with differing spaces share one padded layout (envs/adapters/agent_spaces.py), in both PettingZoo adapters:
each slot's observation against the agent's own, padded and marked with its kind, computed here from the raw env."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from envs.adapters.pettingzoo_adapter import PettingZooParallelAdapter
from envs.adapters.pettingzoo_aec_adapter import PettingZooAECAdapter
from envs.base import StepBuffers
from envs.spaces import ActionSpace
from tests.fake_envs import mask_at

MIXED = "tests.fake_envs:MixedSpacesParallelEnv"


def padded(obs: Any, width: int, kind: int, kinds: int) -> np.ndarray:
    """The reference: ``obs`` flattened, zeros to ``width``, then the one-hot of ``kind`` among ``kinds``."""
    flat = np.asarray(obs, dtype=np.float64).reshape(-1)
    out = np.zeros(width + kinds)
    out[:len(flat)] = flat
    out[width + kind] = 1.0
    return out


def _parallel(entry_point: str, num_envs: int, **kwargs: Any) -> tuple[PettingZooParallelAdapter, StepBuffers]:
    env = PettingZooParallelAdapter(entry_point, num_envs, max_steps=0, kwargs=kwargs)
    return env, StepBuffers.allocate(env.spec, num_envs)


def test_differing_observations_and_action_counts_are_padded_masked_and_marked() -> None:
    env, buf = _parallel(MIXED, 2, what="obs")  # a, b: 4-vector, Discrete(3, start=-1); c: 6-vector, Discrete(4)
    assert env.spec.obs_shape == (6 + 2,) and env.spec.action == ActionSpace.discrete(4) and env.spec.action_mask
    env.reset(buf, seed=5)
    for e in range(2):
        for j, kind in enumerate((0, 0, 1)):
            raw = [0, 0, j, 5 + e] + ([7, 8] if j == 2 else [])
            np.testing.assert_array_equal(buf.obs[3 * e + j], padded(raw, 6, kind, 2))
            assert buf.action_mask[3 * e + j].tolist() == ([1, 1, 1, 1] if j == 2 else [1, 1, 1, 0])
    buf.actions[:] = [2, 0, 3, 1, 1, 0]
    env.step(buf)
    received = env._envs[0].received[-1], env._envs[1].received[-1]
    assert received == ({"a": 1, "b": -1, "c": 3}, {"a": 0, "b": 0, "c": 0})  # start -1 for a and b, 0 for c
    assert buf.rewards[:3].tolist() == [0.0, 100 + 10 - 1, 200 + 10 + 3]  # a terminated at t=1: held
    np.testing.assert_array_equal(buf.obs[2], padded([0, 1, 2, 5, 7, 8], 6, 1, 2))


def test_an_action_beyond_its_own_agents_count_is_refused_naming_the_agent() -> None:
    env, buf = _parallel(MIXED, 2, what="obs")
    env.reset(buf, seed=0)
    buf.actions[:] = [0, 0, 3, 0, 3, 0]  # 3 is legal for c (slot 2), not for b of env 1 (slot 4)
    with pytest.raises(ValueError, match=rf"^pettingzoo env '{MIXED}' \(env 1, agent 'b'\): action 3 is out of "
                                         r"range \[0, 3\)$"):
        env.step(buf)


def test_the_envs_own_masks_are_kept_within_each_agents_actions() -> None:
    env, buf = _parallel(MIXED, 1, what="masked")  # a, b: Discrete(4) and 4 flags; c: Discrete(5) and 5 flags
    assert env.spec.action == ActionSpace.discrete(5) and env.spec.obs_shape == (6 + 2,)
    env.reset(buf, seed=0)
    for t in range(2):
        for j in range(3):
            own = mask_at(t, j).tolist()
            assert buf.action_mask[j].tolist() == own + ([1] if j == 2 else [0]), (t, j)
        buf.actions[:] = [int(np.flatnonzero(m)[0]) for m in buf.action_mask]
        env.step(buf)


def test_real_mpe_simple_tag_slots_match_the_raw_env_padded() -> None:
    """3 adversaries (16 values, kind 0) and 1 good agent (14, kind 1), Discrete(5) each: no mask needed."""
    from mpe2 import simple_tag_v3

    env, buf = _parallel("mpe2.simple_tag_v3:parallel_env", 1)
    raw = simple_tag_v3.parallel_env()
    assert env.spec.obs_shape == (18,) and env.spec.action == ActionSpace.discrete(5) and not env.spec.action_mask
    env.reset(buf, seed=3)
    observations, _ = raw.reset(seed=3)
    rng = np.random.default_rng(0)
    for t in range(25):  # max_cycles: the 25th step ends the episode (the adapter then resets)
        for j, agent in enumerate(raw.possible_agents):
            np.testing.assert_allclose(buf.obs[j], padded(observations[agent], 16, int(j == 3), 2), err_msg=f"{t}")
        buf.actions[:] = rng.integers(0, 5, size=4)
        env.step(buf)
        observations, rewards, _, _, _ = raw.step({a: int(buf.actions[j]) for j, a in enumerate(raw.possible_agents)})
        assert buf.rewards.tolist() == pytest.approx([rewards[a] for a in raw.possible_agents])
    raw.close()
    env.close()


def test_real_mpe_box_actions_of_differing_sizes_reach_each_agent_cut_to_its_own() -> None:
    """simple_speaker_listener, continuous: speaker Box(3) in [0, 1], listener Box(5): one Box(5)."""
    from mpe2 import simple_speaker_listener_v4

    kwargs = {"continuous_actions": True}
    env, buf = _parallel("mpe2.simple_speaker_listener_v4:parallel_env", 1, **kwargs)
    raw = simple_speaker_listener_v4.parallel_env(**kwargs)
    assert env.spec.action == ActionSpace.box(np.zeros(5), np.ones(5)) and not env.spec.action_mask
    assert env.spec.obs_shape == (11 + 2,)
    env.reset(buf, seed=1)
    observations, _ = raw.reset(seed=1)
    rng = np.random.default_rng(1)
    for t in range(10):
        for j, agent in enumerate(raw.possible_agents):
            np.testing.assert_allclose(buf.obs[j], padded(observations[agent], 11, j, 2), err_msg=f"{t}")
        buf.actions[:] = rng.normal(0.5, 0.7, size=(2, 5)).astype(np.float32)
        env.step(buf)
        sent = {"speaker_0": np.clip(buf.actions[0, :3], 0, 1), "listener_0": np.clip(buf.actions[1], 0, 1)}
        observations, rewards, _, _, _ = raw.step(sent)
        assert buf.rewards.tolist() == pytest.approx([rewards[a] for a in raw.possible_agents])
    raw.close()
    env.close()


def test_turn_based_agents_with_differing_spaces_in_the_aec_adapter() -> None:
    """simple_speaker_listener as an AEC env: speaker (3 values, Discrete(3)) and listener (11, Discrete(5))."""
    from mpe2 import simple_speaker_listener_v4

    env = PettingZooAECAdapter("mpe2.simple_speaker_listener_v4:env", 1, max_steps=0, kwargs={})
    buf = StepBuffers.allocate(env.spec, 1)
    raw = simple_speaker_listener_v4.env()
    assert env.spec.obs_shape == (13,) and env.spec.action == ActionSpace.discrete(5) and env.spec.action_mask
    env.reset(buf, seed=2)
    raw.reset(seed=2)
    rng = np.random.default_rng(2)
    for move in range(20):
        agent = raw.agent_selection
        j = raw.possible_agents.index(agent)
        assert buf.active.tolist() == [j == 0, j == 1], move
        np.testing.assert_allclose(buf.obs[j], padded(raw.observe(agent), 11, j, 2), err_msg=f"{move}")
        assert buf.action_mask[j].tolist() == ([1, 1, 1, 0, 0] if j == 0 else [1] * 5)
        buf.actions[:] = 0
        buf.actions[j] = rng.integers(0, 3 if j == 0 else 5)
        env.step(buf)
        raw.step(int(buf.actions[j]))
    with pytest.raises(ValueError, match=r"action 4"):
        buf.actions[:] = 4
        env.step(buf)
    raw.close()
    env.close()


@pytest.mark.parametrize(("what", "why"), [
    ("dtype", r"the observation dtypes differ \('a' has observation \(4,\) float32, actions .*; 'c' has observation "
              r"\(4,\) float64"),
    ("rank", r"an observation is not a 1-D array \('a' has observation \(4,\) float32, actions .*; 'c' has "
             r"observation \(2, 2\) float32"),
    ("box", r"the actions are not all Discrete or all 1-D Box"),
])
def test_spaces_that_cannot_be_padded_are_refused_naming_both_agents(what: str, why: str) -> None:
    with pytest.raises(ValueError, match=rf"^pettingzoo env '{MIXED}': the agents' spaces differ and cannot be padded "
                                         rf"into one layout: {why}.*; agents with differing spaces are padded into one "
                                         r"layout when every agent's observation is a 1-D array of one dtype and the "
                                         r"actions are all Discrete or all 1-D Box$"):
        PettingZooParallelAdapter(MIXED, 1, max_steps=0, kwargs={"what": what})
