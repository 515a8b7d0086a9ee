"""Built-in vectorised MPE simple_spread: mpe2's ``simple_spread_v3`` (continuous actions) in numba kernels.

``N`` agents and ``N`` landmarks on a plane. The physics, observations and rewards replicate
``mpe2.simple_spread_v3.parallel_env(N=N, local_ratio=..., max_cycles=..., continuous_actions=True)``
(mpe2 1.1.x) operation for operation, in float64 with float32 observations:

* **Action** of an agent: ``Box(0, 1, (5,))`` float32, clipped into ``[0, 1]`` first (as PettingZoo's
  ``ClipOutOfBoundsWrapper`` does). Component 0 is unused ("no-op"); the force is
  ``u = SENSITIVITY * (a[2] - a[1], a[4] - a[3])`` with the differences taken in float32. Agents are silent
  (no communication action).
* **Physics** (``World.step``), per step: every pair of agents ``i < j`` pushes with the soft contact force
  ``CONTACT_FORCE * (p_i - p_j) / |p_i - p_j| * CONTACT_MARGIN * logaddexp(0, -(|p_i - p_j| - 2 * AGENT_SIZE)
  / CONTACT_MARGIN)`` (+ on ``i``, - on ``j``; applied at every distance, not only on contact; landmarks do not
  collide); then ``p += v * DT``, ``v *= 1 - DAMPING``, ``v += F / mass * DT`` (mass 1, no speed limit).
* **Reward** of agent ``i``: ``(1 - local_ratio) * G + local_ratio * L_i`` where the shared
  ``G = -sum_l min_j |p_j - q_l|`` over landmarks ``q_l`` and the local ``L_i = -#{j != i : |p_i - p_j| <
  2 * AGENT_SIZE}`` counts agent-agent collisions; both measured after the move.
* **Observation** of agent ``i`` (``6N`` float32): ``[v_i (2), p_i (2), q_l - p_i for every landmark l (2N),
  p_j - p_i for every other agent j in index order (2(N-1)), communication of the other agents (2(N-1),
  always 0 because agents are silent)]``.
* **Episodes** never terminate; they are truncated after ``max_steps`` steps (mpe2's ``max_cycles``; 25 when
  ``max_steps <= 0``), for all agents of an env together, then the env auto-resets. A reset draws the agents'
  positions and then the landmarks' uniformly in ``[-1, 1]^2`` (velocities 0): ``reset(buffers, seed)`` draws
  env 0's world exactly as ``mpe2``'s ``reset(seed=seed)`` does (same NumPy generator, same draw order);
  later resets come from a pool refilled from the same generator, so a run is a deterministic function of the
  seed and the actions.

**Global state** (``global_state``), ``state_dim(N) = 6N`` float32 per env, three blocks of ``[N, 2]``:
``[agent positions p_0..p_{N-1} (2N), agent velocities v_0..v_{N-1} (2N), landmark positions q_0..q_{N-1}
(2N)]``, i.e. ``state.reshape(num_envs, 3, N, 2)[:, block, index, xy]``. Agent slot of agent ``a`` of env
``e``: ``e * num_agents + a``. The spec declares ``state_size = state_dim(N)``: ``reset``/``step`` write every
env's state into all ``N`` of its slots of ``buffers.global_state``, and the last state of an episode that
ended on the step into its slots of ``buffers.final_global_state``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from numba import njit

from envs.base import EnvSpec, StepBuffers
from envs.errors import EnvConfigError
from envs.spaces import ActionSpace

DT = 0.1
"""Simulation time step (mpe2 ``World.dt``)."""
DAMPING = 0.25
"""Velocity damping per step (mpe2 ``World.damping``)."""
CONTACT_FORCE = 1e2
"""Stiffness of the soft contact force (mpe2 ``World.contact_force``)."""
CONTACT_MARGIN = 1e-3
"""Softness of the contact force (mpe2 ``World.contact_margin``)."""
AGENT_SIZE = 0.15
"""Agent radius; two agents collide below ``2 * AGENT_SIZE`` apart."""
SENSITIVITY = 5.0
"""Force per unit of action difference (mpe2 ``SimpleEnv._set_action``)."""
ACTION_DIM = 5
"""Components of one agent's action: no-op, left, right, down, up."""
COMM_DIM = 2
"""Communication channels per agent in mpe2's simple_spread (always zero: agents are silent)."""
DEFAULT_MAX_STEPS = 25
"""mpe2's default ``max_cycles``; used when ``max_steps <= 0``."""
DEFAULT_LOCAL_RATIO = 0.5
"""mpe2's default weight of the local (collision) reward."""
SPREAD_KWARGS = ("local_ratio",)
"""The env.kwargs keys simple_spread accepts."""


def obs_dim(num_agents: int) -> int:
    """Observation size of one agent: velocity, position, landmarks, other agents, their communication."""
    return 2 + 2 + 2 * num_agents + 2 * (num_agents - 1) + COMM_DIM * (num_agents - 1)


def state_dim(num_agents: int) -> int:
    """Global state size of one env: agent positions, agent velocities, landmark positions (2 each)."""
    return 6 * num_agents


def spread_local_ratio(kwargs: Mapping[str, Any]) -> float:
    """The validated ``local_ratio`` from env.kwargs (default 0.5); EnvConfigError naming bad/unknown keys."""
    unknown = sorted(str(k) for k in kwargs if k not in SPREAD_KWARGS)
    if unknown:
        allowed = ", ".join(repr(k) for k in SPREAD_KWARGS)
        raise EnvConfigError(f"env.kwargs for env 'simple_spread' has unknown keys {unknown}; allowed keys: {allowed}")
    value = kwargs.get("local_ratio", DEFAULT_LOCAL_RATIO)
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not 0.0 <= float(value) <= 1.0:
        raise EnvConfigError(f"env.kwargs.local_ratio for env 'simple_spread' must be a number in [0, 1], "
                             f"got {value!r}")
    return float(value)


@njit(cache=True)
def _logaddexp0(y: float) -> float:
    """``numpy.logaddexp(0, y)`` with NumPy's own branches."""
    if y == 0.0:
        return math.log(2.0)
    if y < 0.0:
        return math.log1p(math.exp(y))
    return y + math.log1p(math.exp(-y))


@njit(cache=True)
def _clip01(value):
    """A float32 action component clipped into [0, 1], in float32 (``np.clip`` onto the Box bounds)."""
    return min(max(value, np.float32(0.0)), np.float32(1.0))


@njit(cache=True)
def _move(e, agent_pos, agent_vel, actions, force):
    """One ``World.step`` of env ``e``: action forces, pairwise contact forces, damped Euler integration."""
    n = agent_pos.shape[1]
    for i in range(n):
        s = e * n + i
        force[i, 0] = np.float64(_clip01(actions[s, 2]) - _clip01(actions[s, 1])) * SENSITIVITY
        force[i, 1] = np.float64(_clip01(actions[s, 4]) - _clip01(actions[s, 3])) * SENSITIVITY
    dist_min = AGENT_SIZE + AGENT_SIZE
    for a in range(n):
        for b in range(a + 1, n):
            dx = agent_pos[e, a, 0] - agent_pos[e, b, 0]
            dy = agent_pos[e, a, 1] - agent_pos[e, b, 1]
            dist = math.sqrt(dx * dx + dy * dy)
            penetration = _logaddexp0(-(dist - dist_min) / CONTACT_MARGIN) * CONTACT_MARGIN
            fx = CONTACT_FORCE * dx / dist * penetration
            fy = CONTACT_FORCE * dy / dist * penetration
            force[a, 0] += fx
            force[a, 1] += fy
            force[b, 0] -= fx
            force[b, 1] -= fy
    for i in range(n):
        for d in range(2):
            agent_pos[e, i, d] += agent_vel[e, i, d] * DT
            agent_vel[e, i, d] = agent_vel[e, i, d] * (1 - DAMPING) + force[i, d] * DT


@njit(cache=True)
def _shared_reward(e, agent_pos, landmark_pos):
    """mpe2's global reward: minus the sum over landmarks of the nearest agent's distance."""
    n = agent_pos.shape[1]
    reward = 0.0
    for l in range(landmark_pos.shape[1]):
        nearest = np.inf
        for j in range(n):
            dx = agent_pos[e, j, 0] - landmark_pos[e, l, 0]
            dy = agent_pos[e, j, 1] - landmark_pos[e, l, 1]
            nearest = min(nearest, math.sqrt(dx * dx + dy * dy))
        reward -= nearest
    return reward


@njit(cache=True)
def _collisions(e, i, agent_pos):
    """mpe2's local reward of agent ``i``: minus the number of other agents it overlaps."""
    reward = 0.0
    for j in range(agent_pos.shape[1]):
        if j != i:
            dx = agent_pos[e, j, 0] - agent_pos[e, i, 0]
            dy = agent_pos[e, j, 1] - agent_pos[e, i, 1]
            if math.sqrt(dx * dx + dy * dy) < AGENT_SIZE + AGENT_SIZE:
                reward -= 1.0
    return reward


@njit(cache=True)
def _observe_env(e, agent_pos, agent_vel, landmark_pos, out):
    """Write every agent of env ``e``'s observation into ``out[e * N + i]`` (layout in the module docstring)."""
    n = agent_pos.shape[1]
    for i in range(n):
        s = e * n + i
        px = agent_pos[e, i, 0]
        py = agent_pos[e, i, 1]
        out[s, 0] = agent_vel[e, i, 0]
        out[s, 1] = agent_vel[e, i, 1]
        out[s, 2] = px
        out[s, 3] = py
        k = 4
        for l in range(landmark_pos.shape[1]):
            out[s, k] = landmark_pos[e, l, 0] - px
            out[s, k + 1] = landmark_pos[e, l, 1] - py
            k += 2
        for j in range(n):
            if j != i:
                out[s, k] = agent_pos[e, j, 0] - px
                out[s, k + 1] = agent_pos[e, j, 1] - py
                k += 2
        while k < out.shape[1]:
            out[s, k] = 0.0
            k += 1


@njit(cache=True)
def _state_env(e, agent_pos, agent_vel, landmark_pos, out, row):
    """Write env ``e``'s global state into ``out[row]``: agent positions, agent velocities, landmark positions."""
    n = agent_pos.shape[1]
    for i in range(n):
        for d in range(2):
            out[row, 2 * i + d] = agent_pos[e, i, d]
            out[row, 2 * n + 2 * i + d] = agent_vel[e, i, d]
            out[row, 4 * n + 2 * i + d] = landmark_pos[e, i, d]


@njit(cache=True)
def _state_slots(e, agent_pos, agent_vel, landmark_pos, out):
    """Write env ``e``'s global state into each of its agent slots ``out[e * N + i]``."""
    n = agent_pos.shape[1]
    for i in range(n):
        _state_env(e, agent_pos, agent_vel, landmark_pos, out, e * n + i)


@njit(cache=True)
def _state_all(agent_pos, agent_vel, landmark_pos, out):
    """Every env's global state into ``out``."""
    for e in range(agent_pos.shape[0]):
        _state_env(e, agent_pos, agent_vel, landmark_pos, out, e)


@njit(cache=True)
def _observe_and_state_all(agent_pos, agent_vel, landmark_pos, obs, global_state):
    """Every env's observations into ``obs`` and its global state into its slots of ``global_state``."""
    for e in range(agent_pos.shape[0]):
        _observe_env(e, agent_pos, agent_vel, landmark_pos, obs)
        _state_slots(e, agent_pos, agent_vel, landmark_pos, global_state)


@njit(cache=True)
def _step_kernel(agent_pos, agent_vel, landmark_pos, steps, returns, final_state, max_steps, local_ratio,
                 reset_pool, pool_pos, actions, obs, rewards, terminated, truncated, final_obs, episode_done,
                 episode_return, episode_length, global_state, final_global_state) -> int:
    """Step every env once, auto-resetting ended ones from ``reset_pool[pool_pos:]``.

    Returns the new pool position, or ``-1 - s`` if agent slot ``s`` has a NaN action (nothing is stepped then).
    """
    num_envs = agent_pos.shape[0]
    n = agent_pos.shape[1]
    for s in range(num_envs * n):
        for k in range(ACTION_DIM):
            if np.isnan(actions[s, k]):
                return -1 - s
    force = np.zeros((n, 2), dtype=np.float64)
    for e in range(num_envs):
        _move(e, agent_pos, agent_vel, actions, force)
        shared = _shared_reward(e, agent_pos, landmark_pos)
        for i in range(n):
            s = e * n + i
            reward = shared * (1 - local_ratio) + _collisions(e, i, agent_pos) * local_ratio
            rewards[s] = reward
            returns[e, i] += reward
            terminated[s] = False
        steps[e] += 1
        ended = steps[e] >= max_steps
        for i in range(n):
            s = e * n + i
            truncated[s] = ended
            episode_done[s] = ended
        if ended:
            _observe_env(e, agent_pos, agent_vel, landmark_pos, final_obs)
            _state_env(e, agent_pos, agent_vel, landmark_pos, final_state, e)
            _state_slots(e, agent_pos, agent_vel, landmark_pos, final_global_state)
            for i in range(n):
                s = e * n + i
                episode_return[s] = returns[e, i]
                episode_length[s] = steps[e]
                returns[e, i] = 0.0
                for d in range(2):
                    agent_pos[e, i, d] = reset_pool[pool_pos, i, d]
                    agent_vel[e, i, d] = 0.0
                    landmark_pos[e, i, d] = reset_pool[pool_pos, n + i, d]
            pool_pos += 1
            steps[e] = 0
        _observe_env(e, agent_pos, agent_vel, landmark_pos, obs)
        _state_slots(e, agent_pos, agent_vel, landmark_pos, global_state)
    return pool_pos


class SimpleSpreadVec:
    """``num_envs`` MPE simple_spread worlds of ``num_agents`` agents and landmarks, stepped by numba kernels."""

    def __init__(self, num_envs: int, *, num_agents: int = 3, max_steps: int = DEFAULT_MAX_STEPS,
                 local_ratio: float = DEFAULT_LOCAL_RATIO) -> None:
        """Create the worlds; ``max_steps <= 0`` means mpe2's 25, ``local_ratio`` weighs the collision reward."""
        if num_envs <= 0:
            raise EnvConfigError(f"SimpleSpreadVec needs num_envs >= 1, got {num_envs}")
        if num_agents < 1:
            raise EnvConfigError(f"simple_spread needs num_agents >= 1, got {num_agents}")
        self.local_ratio: float = spread_local_ratio({"local_ratio": local_ratio})
        self.spec: EnvSpec = self.spec_for(num_agents)
        self.num_envs: int = num_envs
        self.num_agents: int = num_agents
        self.state_dim: int = state_dim(num_agents)
        self.max_steps: int = max_steps if max_steps > 0 else DEFAULT_MAX_STEPS
        self._agent_pos = np.zeros((num_envs, num_agents, 2), dtype=np.float64)
        self._agent_vel = np.zeros((num_envs, num_agents, 2), dtype=np.float64)
        self._landmark_pos = np.zeros((num_envs, num_agents, 2), dtype=np.float64)
        self._steps = np.zeros(num_envs, dtype=np.int64)
        self._returns = np.zeros((num_envs, num_agents), dtype=np.float64)
        self._final_state = np.zeros((num_envs, self.state_dim), dtype=np.float32)
        self._pool_size = max(num_envs, 64)
        self._pool = np.zeros((self._pool_size, 2 * num_agents, 2), dtype=np.float64)
        self._pool_pos = self._pool_size
        self._rng: np.random.Generator | None = None

    @staticmethod
    def spec_for(num_agents: int) -> EnvSpec:
        """The spec of a simple_spread with this agent count: ``6N`` float32 observations, ``Box(0, 1, (5,))``,
        a ``6N`` float32 global state."""
        return EnvSpec(num_agents=num_agents, obs_shape=(obs_dim(num_agents),), obs_dtype="float32",
                       action=ActionSpace.box([0.0] * ACTION_DIM, [1.0] * ACTION_DIM),
                       state_size=state_dim(num_agents))

    def _draw_worlds(self, count: int) -> np.ndarray:
        """``[count, 2N, 2]`` fresh worlds (agents' positions, then landmarks'), in mpe2's draw order."""
        assert self._rng is not None
        return self._rng.uniform(-1.0, 1.0, size=(count, 2 * self.num_agents, 2))

    def reset(self, buffers: StepBuffers, seed: int) -> None:
        """Reseed, draw a fresh world for every env, write first observations and clear everything else."""
        self._rng = np.random.default_rng(seed)
        worlds = self._draw_worlds(self.num_envs)
        self._agent_pos[:] = worlds[:, : self.num_agents]
        self._landmark_pos[:] = worlds[:, self.num_agents:]
        self._agent_vel[:] = 0.0
        self._steps[:] = 0
        self._returns[:] = 0.0
        self._final_state[:] = 0.0
        self._pool_pos = self._pool_size  # force a refill from the new generator
        _observe_and_state_all(self._agent_pos, self._agent_vel, self._landmark_pos, buffers.obs,
                               buffers.global_state)
        buffers.clear_step_outputs()

    def step(self, buffers: StepBuffers) -> None:
        """Apply ``buffers.actions`` (``[slots, 5]`` in ``[0, 1]``, clipped); write results; auto-reset ended envs."""
        if self._rng is None:
            raise RuntimeError("SimpleSpreadVec.step() called before reset()")
        if self._pool_size - self._pool_pos < self.num_envs:
            self._pool[:] = self._draw_worlds(self._pool_size)
            self._pool_pos = 0
        pos = _step_kernel(
            self._agent_pos, self._agent_vel, self._landmark_pos, self._steps, self._returns, self._final_state,
            self.max_steps, self.local_ratio, self._pool, self._pool_pos,
            buffers.actions, buffers.obs, buffers.rewards, buffers.terminated, buffers.truncated,
            buffers.final_obs, buffers.episode_done, buffers.episode_return, buffers.episode_length,
            buffers.global_state, buffers.final_global_state,
        )
        if pos < 0:
            slot = -1 - pos
            raise EnvConfigError(f"SimpleSpreadVec: action {buffers.actions[slot].tolist()} for agent slot {slot} "
                                 f"has NaN; actions must be numbers (clipped into [0, 1])")
        self._pool_pos = pos

    def close(self) -> None:
        """Nothing to release."""

    def global_state(self, out: np.ndarray) -> None:
        """Write the current global state of every env into ``out`` ``[num_envs, state_dim]`` float32.

        Layout (module docstring): agent positions (2N), agent velocities (2N), landmark positions (2N). After a
        step that truncated an env this is the state of its *new* episode, matching ``buffers.obs``.
        """
        self._check_state_out(out, "global_state")
        _state_all(self._agent_pos, self._agent_vel, self._landmark_pos, out)

    def final_global_state(self, out: np.ndarray) -> None:
        """Write the last global state of each env's most recently ended episode (like ``final_obs``) into ``out``.

        Valid for the envs whose ``episode_done`` was set by the last ``step``; same layout as ``global_state``.
        """
        self._check_state_out(out, "final_global_state")
        out[:] = self._final_state

    def _check_state_out(self, out: np.ndarray, who: str) -> None:
        expected = (self.num_envs, self.state_dim)
        if out.shape != expected or out.dtype != np.float32:
            raise EnvConfigError(f"SimpleSpreadVec.{who}: out must be float32 of shape {expected}, "
                                 f"got {out.dtype} {out.shape}")

    # --- test hooks: set and read one env's world by hand -------------------------------------------------

    def set_world(self, env_index: int, agent_pos: np.ndarray, agent_vel: np.ndarray, landmark_pos: np.ndarray,
                  *, buffers: StepBuffers | None = None) -> None:
        """Overwrite env ``env_index``'s world (each ``[N, 2]``); the step count is kept.

        With ``buffers``, that env's observations and global state are rewritten; otherwise the next ``step``
        starts from it.
        """
        shape = (self.num_agents, 2)
        for name, value in (("agent_pos", agent_pos), ("agent_vel", agent_vel), ("landmark_pos", landmark_pos)):
            if np.shape(value) != shape:
                raise EnvConfigError(f"SimpleSpreadVec.set_world: {name} must have shape {shape}, "
                                     f"got {np.shape(value)}")
        self._agent_pos[env_index] = agent_pos
        self._agent_vel[env_index] = agent_vel
        self._landmark_pos[env_index] = landmark_pos
        if buffers is not None:
            _observe_env(env_index, self._agent_pos, self._agent_vel, self._landmark_pos, buffers.obs)
            _state_slots(env_index, self._agent_pos, self._agent_vel, self._landmark_pos, buffers.global_state)

    def get_world(self, env_index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Float64 copies of env ``env_index``'s ``(agent_pos, agent_vel, landmark_pos)``, each ``[N, 2]``."""
        return (self._agent_pos[env_index].copy(), self._agent_vel[env_index].copy(),
                self._landmark_pos[env_index].copy())
