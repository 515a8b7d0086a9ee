"""The env contract's global state (EnvSpec.state_size, StepBuffers.global_state / final_global_state) and the
PettingZoo adapter's ``state_space`` / ``state()`` support, against mpe2's simple_spread stepped by hand."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gymnasium import spaces
from mpe2 import simple_spread_v3

from envs.base import EnvSpec, StepBuffers, step_buffer_fields
from envs.errors import EnvConfigError, EnvRaised
from envs.adapters.pettingzoo_adapter import PettingZooParallelAdapter
from envs.spaces import ActionSpace
from tests.fake_envs import StaggeredParallelEnv

SPREAD = "mpe2.simple_spread_v3:parallel_env"
STATEFUL = "tests.test_global_state:StatefulStaggeredEnv"
N, MAX_CYCLES, NUM_ENVS, SEED = 3, 5, 2, 11


class StatefulStaggeredEnv(StaggeredParallelEnv):
    """StaggeredParallelEnv (a ends at t=1, b at t=2, c at t=3) with global state ``[episode, t, seed]``;
    ``state_shape`` makes ``state()`` return the wrong shape, ``state_fails`` makes it raise."""

    def __init__(self, state_shape: tuple[int, ...] = (3,), state_fails: bool = False) -> None:
        super().__init__()
        self.state_space = spaces.Box(-np.inf, np.inf, shape=(3,), dtype=np.float32)
        self.state_shape = tuple(state_shape)
        self.state_fails = state_fails
        self.state_calls = 0

    def state(self) -> np.ndarray:
        self.state_calls += 1
        if self.state_fails:
            raise RuntimeError("no state today")
        values = np.array([self.episode, self.t, self.seed], dtype=np.float64)
        return np.resize(values, self.state_shape)


def _adapter(entry_point: str, num_envs: int, **kwargs: Any) -> tuple[PettingZooParallelAdapter, StepBuffers]:
    env = PettingZooParallelAdapter(entry_point, num_envs, max_steps=0, kwargs=kwargs)
    return env, StepBuffers.allocate(env.spec, num_envs)


def _env_rows(array: np.ndarray, e: int, n: int) -> np.ndarray:
    """The rows of env ``e``'s ``n`` agent slots."""
    return array[e * n:(e + 1) * n]


def test_state_size_is_validated_and_sizes_both_arrays() -> None:
    action = ActionSpace.discrete(2)
    with pytest.raises(EnvConfigError, match=r"EnvSpec.state_size must be an int >= 0 .* got -1"):
        EnvSpec(num_agents=1, obs_shape=(2,), obs_dtype="float32", action=action, state_size=-1)
    spec = EnvSpec(num_agents=2, obs_shape=(2,), obs_dtype="float32", action=action, state_size=4)
    fields = {name: (shape, dtype) for name, shape, dtype in step_buffer_fields(spec, 6)}
    assert fields["global_state"] == ((6, 4), "float32") and fields["final_global_state"] == ((6, 4), "float32")
    buffers = StepBuffers.allocate(spec, 3)
    buffers.final_global_state[:] = 5.0
    buffers.global_state[:] = 5.0
    buffers.clear_step_outputs()
    assert not buffers.final_global_state.any() and (buffers.global_state == 5.0).all()
    stateless = StepBuffers.allocate(EnvSpec(num_agents=2, obs_shape=(2,), obs_dtype="float32", action=action), 3)
    assert stateless.global_state.shape == (6, 0) and stateless.final_global_state.shape == (6, 0)


def test_mpe2_state_reaches_every_slot_and_final_state_matches_a_reference_stepped_by_hand() -> None:
    env, buf = _adapter(SPREAD, NUM_ENVS, N=N, max_cycles=MAX_CYCLES, continuous_actions=True)
    references = [simple_spread_v3.parallel_env(N=N, max_cycles=MAX_CYCLES, continuous_actions=True)
                  for _ in range(NUM_ENVS)]
    assert env.spec.state_size == int(np.prod(references[0].state_space.shape)) == 54
    assert buf.global_state.shape == (NUM_ENVS * N, 54) and buf.final_global_state.shape == (NUM_ENVS * N, 54)
    env.reset(buf, seed=SEED)
    for e, reference in enumerate(references):
        reference.reset(seed=SEED + e)
        assert (_env_rows(buf.global_state, e, N) == reference.state()).all()
    rng = np.random.default_rng(0)
    ends = 0
    for t in range(1, 2 * MAX_CYCLES + 3):
        buf.actions[:] = rng.uniform(-0.5, 1.5, size=buf.actions.shape)
        env.step(buf)
        done = t % MAX_CYCLES == 0
        assert buf.truncated.tolist() == [done] * (NUM_ENVS * N)
        for e, reference in enumerate(references):
            actions = np.clip(_env_rows(buf.actions, e, N), 0.0, 1.0)
            reference.step(dict(zip(reference.possible_agents, actions)))
            if done:
                np.testing.assert_array_equal(_env_rows(buf.final_global_state, e, N),
                                              np.broadcast_to(reference.state(), (N, 54)))
                reference.reset()  # unseeded, like the adapter's auto-reset: the same draw from the same generator
            np.testing.assert_array_equal(_env_rows(buf.global_state, e, N),
                                          np.broadcast_to(reference.state(), (N, 54)), err_msg=f"env {e}, t={t}")
        if done:
            ends += 1
            assert not np.array_equal(buf.final_global_state, buf.global_state)
    assert ends == 2
    env.close()


def test_final_state_belongs_to_the_step_the_env_ended_not_to_early_finishers() -> None:
    # a terminates at t=1, b is truncated at t=2, c terminates at t=3: the env ends (and resets) at t=3
    env, buf = _adapter(STATEFUL, NUM_ENVS)
    assert env.spec.state_size == 3
    env.reset(buf, seed=4)
    assert buf.global_state.tolist() == [[0, 0, 4 + e] for e in range(NUM_ENVS) for _ in range(3)]
    for t in (1, 2):
        buf.final_global_state[:] = -1.0
        buf.actions[:] = 1
        env.step(buf)
        # inactive slots (early finishers) still carry their env's state; no final state yet
        assert buf.global_state.tolist() == [[0, t, 4 + e] for e in range(NUM_ENVS) for _ in range(3)]
        assert (buf.final_global_state == -1.0).all() and not (buf.terminated | buf.truncated).any()
    buf.actions[:] = 1
    env.step(buf)
    assert (buf.terminated | buf.truncated).all()
    assert buf.final_global_state.tolist() == [[0, 3, 4 + e] for e in range(NUM_ENVS) for _ in range(3)]
    assert buf.global_state.tolist() == [[1, 0, 4 + e] for e in range(NUM_ENVS) for _ in range(3)]
    env.close()


def test_env_without_state_space_has_no_state_and_is_never_asked() -> None:
    env, buf = _adapter("tests.fake_envs:StaggeredParallelEnv", NUM_ENVS)
    assert env.spec.state_size == 0
    assert buf.global_state.shape == (NUM_ENVS * 3, 0) and buf.final_global_state.shape == (NUM_ENVS * 3, 0)
    env.reset(buf, seed=0)
    for _ in range(3):  # to the episode end; StaggeredParallelEnv.state() would raise NotImplementedError
        buf.actions[:] = 1
        env.step(buf)
    assert buf.active.all() and (buf.obs[:, 0] == 1).all()  # the second episode began
    env.close()


def test_state_of_the_wrong_shape_or_raising_names_env_call_and_shapes() -> None:
    env, buf = _adapter(STATEFUL, 1, state_shape=(2, 2))
    with pytest.raises(EnvConfigError, match=r"^pettingzoo env 'tests.test_global_state:StatefulStaggeredEnv' "
                                             r"\(env 0\) state\(\) after reset\(\) returned shape \(2, 2\) dtype "
                                             r"float64; expected shape \(3,\)"):
        env.reset(buf, seed=0)
    env.close()
    env, buf = _adapter(STATEFUL, 1, state_fails=True)
    with pytest.raises(EnvRaised, match=r"\(env 0\) raised in state\(\) after reset\(\): RuntimeError"):
        env.reset(buf, seed=0)
    env.close()
