"""Built-in vectorised CartPole: Gymnasium's CartPole-v1 dynamics in a numba kernel.

The physics replicate ``gymnasium.envs.classic_control.cartpole.CartPoleEnv`` operation for operation
(same constants, same evaluation order, euler integrator, float64 state, float32 observations), so a
trajectory from the same state under the same actions is bitwise identical to Gymnasium's. The time
limit follows Gymnasium's ``TimeLimit`` wrapper except that ``truncated`` is never set together with
``terminated``: an episode that terminates on its last allowed step is reported as terminated only.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from envs.base import EnvSpec, StepBuffers
from envs.spaces import ActionSpace
from envs.errors import EnvConfigError

GRAVITY = 9.8
MASSCART = 1.0
MASSPOLE = 0.1
TOTAL_MASS = MASSPOLE + MASSCART
LENGTH = 0.5  # half the pole's length
POLEMASS_LENGTH = MASSPOLE * LENGTH
FORCE_MAG = 10.0
TAU = 0.02
THETA_THRESHOLD = 12 * 2 * math.pi / 360
X_THRESHOLD = 2.4
RESET_LOW = -0.05
RESET_HIGH = 0.05
DEFAULT_MAX_STEPS = 500
"""CartPole-v1's own time limit; used when ``max_steps <= 0``."""


@njit(cache=True)
def _step_kernel(
    state: np.ndarray,
    steps: np.ndarray,
    returns: np.ndarray,
    max_steps: int,
    reset_pool: np.ndarray,
    pool_pos: int,
    actions: np.ndarray,
    obs: np.ndarray,
    rewards: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    final_obs: np.ndarray,
    episode_done: np.ndarray,
    episode_return: np.ndarray,
    episode_length: np.ndarray,
) -> int:
    """Step every env once, auto-resetting finished ones from ``reset_pool[pool_pos:]``.

    Returns the new pool position, or ``-1 - i`` if ``actions[i]`` is not 0 or 1 (nothing is stepped then).
    """
    n = state.shape[0]
    for i in range(n):
        if actions[i] != 0 and actions[i] != 1:
            return -1 - i
    for i in range(n):
        x = state[i, 0]
        x_dot = state[i, 1]
        theta = state[i, 2]
        theta_dot = state[i, 3]
        force = FORCE_MAG if actions[i] == 1 else -FORCE_MAG
        costheta = np.cos(theta)
        sintheta = np.sin(theta)
        # Same expression shapes and evaluation order as Gymnasium (np.square(v) == v * v exactly).
        temp = (force + POLEMASS_LENGTH * (theta_dot * theta_dot) * sintheta) / TOTAL_MASS
        thetaacc = (GRAVITY * sintheta - costheta * temp) / (
            LENGTH * (4.0 / 3.0 - MASSPOLE * (costheta * costheta) / TOTAL_MASS)
        )
        xacc = temp - POLEMASS_LENGTH * thetaacc * costheta / TOTAL_MASS
        x = x + TAU * x_dot
        x_dot = x_dot + TAU * xacc
        theta = theta + TAU * theta_dot
        theta_dot = theta_dot + TAU * thetaacc
        state[i, 0] = x
        state[i, 1] = x_dot
        state[i, 2] = theta
        state[i, 3] = theta_dot

        term = x < -X_THRESHOLD or x > X_THRESHOLD or theta < -THETA_THRESHOLD or theta > THETA_THRESHOLD
        steps[i] += 1
        returns[i] += 1.0
        trunc = (not term) and steps[i] >= max_steps
        rewards[i] = 1.0
        terminated[i] = term
        truncated[i] = trunc
        if term or trunc:
            episode_done[i] = True
            episode_return[i] = returns[i]
            episode_length[i] = steps[i]
            if trunc:
                for j in range(4):
                    final_obs[i, j] = state[i, j]
            for j in range(4):
                state[i, j] = reset_pool[pool_pos, j]
            pool_pos += 1
            steps[i] = 0
            returns[i] = 0.0
        else:
            episode_done[i] = False
        for j in range(4):
            obs[i, j] = state[i, j]
    return pool_pos


class CartPoleVec:
    """``num_envs`` CartPole-v1 environments stepped together by a numba kernel.

    Reset states are drawn in NumPy from a ``Generator`` seeded by ``reset(buffers, seed)``: the initial
    states as one ``[num_envs, 4]`` draw (so env 0 starts exactly where ``gymnasium.make('CartPole-v1')
    .reset(seed=seed)`` would), auto-reset states from a pre-drawn pool refilled from the same generator,
    so a run is a deterministic function of the seed and the actions.
    """

    SPEC = EnvSpec(num_agents=1, obs_shape=(4,), obs_dtype="float32", action=ActionSpace.discrete(2))

    def __init__(self, num_envs: int, *, max_steps: int = DEFAULT_MAX_STEPS) -> None:
        """Create ``num_envs`` envs truncated after ``max_steps`` steps (``<= 0``: CartPole-v1's 500)."""
        if num_envs <= 0:
            raise EnvConfigError(f"CartPoleVec needs num_envs >= 1, got {num_envs}")
        self.spec: EnvSpec = self.SPEC
        self.num_envs: int = num_envs
        self.max_steps: int = max_steps if max_steps > 0 else DEFAULT_MAX_STEPS
        self._state = np.zeros((num_envs, 4), dtype=np.float64)
        self._steps = np.zeros(num_envs, dtype=np.int64)
        self._returns = np.zeros(num_envs, dtype=np.float64)
        self._pool_size = max(num_envs, 64)
        self._pool = np.zeros((self._pool_size, 4), dtype=np.float64)
        self._pool_pos = self._pool_size
        self._rng: np.random.Generator | None = None

    def reset(self, buffers: StepBuffers, seed: int) -> None:
        """Reseed, draw a fresh state for every env, write first observations and clear everything else."""
        self._rng = np.random.default_rng(seed)
        self._state[:] = self._rng.uniform(low=RESET_LOW, high=RESET_HIGH, size=(self.num_envs, 4))
        self._steps[:] = 0
        self._returns[:] = 0.0
        self._pool_pos = self._pool_size  # force a refill from the new generator
        buffers.obs[: self.num_envs] = self._state.astype(np.float32)
        buffers.clear_step_outputs()

    def step(self, buffers: StepBuffers) -> None:
        """Apply ``buffers.actions`` (0 = push left, 1 = push right); write results; auto-reset ended envs."""
        if self._rng is None:
            raise RuntimeError("CartPoleVec.step() called before reset()")
        if self._pool_size - self._pool_pos < self.num_envs:
            self._pool[:] = self._rng.uniform(low=RESET_LOW, high=RESET_HIGH, size=(self._pool_size, 4))
            self._pool_pos = 0
        pos = _step_kernel(
            self._state,
            self._steps,
            self._returns,
            self.max_steps,
            self._pool,
            self._pool_pos,
            buffers.actions,
            buffers.obs,
            buffers.rewards,
            buffers.terminated,
            buffers.truncated,
            buffers.final_obs,
            buffers.episode_done,
            buffers.episode_return,
            buffers.episode_length,
        )
        if pos < 0:
            i = -1 - pos
            raise EnvConfigError(
                f"CartPoleVec: action {int(buffers.actions[i])} for env {i} is out of range; actions must be 0 or 1"
            )
        self._pool_pos = pos

    def close(self) -> None:
        """Nothing to release."""

    def set_state(self, env_index: int, state: np.ndarray) -> None:
        """Overwrite env ``env_index``'s physical state ``(x, x_dot, theta, theta_dot)``; step count is kept.

        The observation buffer is not touched: the next ``step`` starts from this state.
        """
        value = np.asarray(state, dtype=np.float64)
        if value.shape != (4,):
            raise EnvConfigError(f"CartPoleVec.set_state expects a state of shape (4,), got {value.shape}")
        self._state[env_index] = value

    def get_state(self, env_index: int) -> np.ndarray:
        """A float64 copy of env ``env_index``'s state ``(x, x_dot, theta, theta_dot)``."""
        return self._state[env_index].copy()
