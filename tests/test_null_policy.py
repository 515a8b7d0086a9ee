"""The benchmark's null policy (uniformly random legal actions, true log-probs) and the synthetic
fixed-cost env, checked against independent NumPy computations."""

from __future__ import annotations

import numpy as np
import pytest

from envs.base import EnvSpec, StepBuffers
from envs.spaces import ActionSpace
from envs.builtin.synthetic import SyntheticVec
from actors.null_policy import NullInference


def spec_of(action: ActionSpace, mask: bool = False) -> EnvSpec:
    return EnvSpec(num_agents=1, obs_shape=(3,), obs_dtype="float32", action=action, action_mask=mask)


def chi_square_ok(counts: np.ndarray, probs: np.ndarray) -> bool:
    """Pearson's test at about the 1e-4 level (a generous bound: 3.7 standard deviations of the statistic)."""
    expected = counts.sum() * probs
    keep = expected > 0
    stat = float((((counts - expected) ** 2)[keep] / expected[keep]).sum())
    dof = int(keep.sum()) - 1
    return stat < dof + 3.7 * np.sqrt(2 * dof)


def test_discrete_actions_are_uniform_with_the_uniform_log_prob() -> None:
    policy = NullInference(spec_of(ActionSpace.discrete(5)), seed=0)
    decisions = policy.decide(np.zeros((40_000, 3), np.float32), np.zeros((40_000, 0), np.float32))
    assert decisions.actions.shape == (40_000,) and decisions.actions.dtype == np.int32
    assert chi_square_ok(np.bincount(decisions.actions, minlength=5), np.full(5, 0.2))
    np.testing.assert_allclose(decisions.logprobs, np.log(0.2), rtol=1e-6)
    assert not decisions.values.any() and decisions.states.shape == (40_000, 0)


def test_masked_multi_discrete_draws_only_legal_actions_uniformly() -> None:
    nvec = (3, 4)
    policy = NullInference(spec_of(ActionSpace.multi_discrete(nvec), mask=True), seed=1)
    rng = np.random.default_rng(2)
    n = 30_000
    masks = (rng.random((n, 7)) < 0.6).astype(np.uint8)
    masks[:50, 3:] = 0  # a component with no legal choice is left unmasked
    decisions = policy.decide(np.zeros((n, 3), np.float32), np.zeros((n, 0), np.float32), masks)
    actions = decisions.actions
    assert actions.shape == (n, 2)
    expected_logprob = np.zeros(n)
    offset = 0
    for i, size in enumerate(nvec):
        legal = masks[:, offset:offset + size].astype(bool)
        legal[~legal.any(axis=1)] = True
        assert legal[np.arange(n), actions[:, i]].all()
        expected_logprob -= np.log(legal.sum(axis=1))
        full = legal.all(axis=1)  # rows where every choice is legal: the draw must be uniform
        assert chi_square_ok(np.bincount(actions[full, i], minlength=size), np.full(size, 1 / size))
        offset += size
    np.testing.assert_allclose(decisions.logprobs, expected_logprob, rtol=1e-5)
    assert set(actions[:50, 1]) == {0, 1, 2, 3}


def test_discrete_draws_follow_the_seed_and_each_policy_keeps_its_own_stream() -> None:
    spec = spec_of(ActionSpace.multi_discrete((4, 3)), mask=True)
    masks = (np.random.default_rng(4).random((500, 7)) < 0.5).astype(np.uint8)
    obs, states = np.zeros((500, 3), np.float32), np.zeros((500, 0), np.float32)
    first, twin, other = (NullInference(spec, seed=seed) for seed in (7, 7, 8))
    drawn = [first.decide(obs, states, masks).actions for _ in range(2)]
    interleaved = [twin.decide(obs, states, masks).actions, other.decide(obs, states, masks).actions,
                   twin.decide(obs, states, masks).actions]
    np.testing.assert_array_equal(drawn[0], interleaved[0])
    np.testing.assert_array_equal(drawn[1], interleaved[2])  # another policy's draws in between change nothing
    assert (drawn[0] != interleaved[1]).any() and (drawn[0] != drawn[1]).any()


def test_box_actions_are_standard_normal_with_their_log_prob() -> None:
    policy = NullInference(spec_of(ActionSpace.box([-1, -1], [1, 1])), seed=3)
    decisions = policy.decide(np.zeros((20_000, 3), np.float32), np.zeros((20_000, 0), np.float32))
    x = decisions.actions
    assert x.shape == (20_000, 2) and x.dtype == np.float32
    assert abs(x.mean()) < 0.03 and abs(x.std() - 1) < 0.03
    np.testing.assert_allclose(decisions.logprobs, (-0.5 * x ** 2 - 0.5 * np.log(2 * np.pi)).sum(axis=1), rtol=1e-5)


def test_synthetic_env_truncates_every_max_steps_with_final_obs() -> None:
    env = SyntheticVec(3, max_steps=4, step_us=0.0)
    buffers = StepBuffers.allocate(env.spec, 3)
    env.reset(buffers, seed=0)
    ends = []
    for _ in range(12):
        env.step(buffers)
        ends.append(buffers.truncated.copy())
        assert not buffers.terminated.any()
        np.testing.assert_array_equal(buffers.episode_done, buffers.truncated)
        if buffers.truncated.any():
            assert (buffers.final_obs[buffers.truncated, 0] == 4).all()  # the obs after the 4th step
    assert (np.array(ends).sum(axis=0) == 3).all()  # each env ends every 4 steps


def test_synthetic_env_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="step_us >= 0"):
        SyntheticVec(2, max_steps=10, step_us=-1)
