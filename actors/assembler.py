"""Segment assembler: packs per-agent steps into fixed rows of ``horizon = bptt_horizon + 1`` steps.

Each agent owns one row being written (``ep_indices[agent]``) and a write position (``ep_lengths[agent]``).
When a row fills it moves to the FULL ring and the agent takes a fresh row from the FREE ring. The last
step of a full row is copied to position 0 of the agent's next row, so every transition inside a row has a
bootstrap value. Rows are never cut at episode ends: ``dones`` are just data the learner masks with.
Ownership of row indices cycles FREE -> writing -> FULL -> shipped (``pop_full``) -> FREE (``release``);
the data itself never moves.

Semantics of one step's fields:

* ``obs``, ``actions``, ``logprobs``, ``values``: the agent's observation, the action sampled for it, its
  behaviour log-probability and the value estimate of that observation.
* ``rewards``, ``dones``, ``bootstrap``: what ARRIVED WITH this observation, i.e. the result of the
  previous transition. The learner's GAE therefore uses ``rewards[t + 1]`` and ``dones[t + 1]`` (and
  ``bootstrap[t + 1]``) for the transition out of step ``t``.
* ``versions[row]``: the policy version that produced the row's FIRST step.
* ``states[row]``: the recurrent state the agent's policy had before its forward pass on the row's FIRST
  step (zero width for feed-forward policies), so the learner can replay the row from the same state.

The hot paths are ``numba.njit`` kernels over the arrays; the class only validates and dispatches.
"""

from __future__ import annotations

import numba
import numpy as np

# Ring bookkeeping lives in one int64[4] array so kernels can update it in place.
_FREE_HEAD, _FREE_COUNT, _FULL_HEAD, _FULL_COUNT = 0, 1, 2, 3
# Row ownership states (debugging aid: catches double releases and releases of unshipped rows).
_FREE, _WRITING, _FULL, _SHIPPED = 0, 1, 2, 3
# Kernel error codes.
_ERR_NO_FREE, _ERR_BAD_AGENT, _ERR_DUP_AGENT, _ERR_BAD_ROW = -1, -2, -3, -4


@numba.njit(cache=True)
def _add_steps_kernel(agent_ids, obs_in, act_in, mask_in, lp_in, val_in, rew_in, done_in, boot_in, state_in,
                      version, obs, actions, masks, logprobs, values, rewards, dones, bootstrap, versions, states,
                      ep_indices, ep_lengths, free_ring, full_ring, rings, row_state, seen, stamp):
    """Write steps; return rows completed, or a negative error code with NOTHING modified."""
    n = agent_ids.shape[0]
    num_agents = ep_indices.shape[0]
    horizon = actions.shape[1]
    num_rows = free_ring.shape[0]
    obs_size = obs.shape[2]
    act_size = actions.shape[2]
    mask_size = masks.shape[2]
    state_size = states.shape[1]
    needed = 0
    for i in range(n):  # validation pass: nothing is written unless the whole call can succeed
        a = agent_ids[i]
        if a < 0 or a >= num_agents:
            return _ERR_BAD_AGENT
        if seen[a] == stamp:
            return _ERR_DUP_AGENT
        seen[a] = stamp
        if ep_lengths[a] == horizon - 1:
            needed += 1
    if needed > rings[_FREE_COUNT]:
        return _ERR_NO_FREE
    completed = 0
    for i in range(n):
        a = agent_ids[i]
        row = ep_indices[a]
        t = ep_lengths[a]
        if t == 0:
            versions[row] = version
            for k in range(state_size):
                states[row, k] = state_in[i, k]
        for k in range(obs_size):
            obs[row, t, k] = obs_in[i, k]
        for k in range(act_size):
            actions[row, t, k] = act_in[i, k]
        for k in range(mask_size):
            masks[row, t, k] = mask_in[i, k]
        logprobs[row, t] = lp_in[i]
        values[row, t] = val_in[i]
        rewards[row, t] = rew_in[i]
        dones[row, t] = done_in[i]
        bootstrap[row, t] = boot_in[i]
        t += 1
        if t == horizon:
            full_ring[(rings[_FULL_HEAD] + rings[_FULL_COUNT]) % num_rows] = row
            rings[_FULL_COUNT] += 1
            row_state[row] = _FULL
            new = free_ring[rings[_FREE_HEAD]]
            rings[_FREE_HEAD] = (rings[_FREE_HEAD] + 1) % num_rows
            rings[_FREE_COUNT] -= 1
            row_state[new] = _WRITING
            for k in range(obs_size):
                obs[new, 0, k] = obs_in[i, k]
            for k in range(act_size):
                actions[new, 0, k] = act_in[i, k]
            for k in range(mask_size):
                masks[new, 0, k] = mask_in[i, k]
            logprobs[new, 0] = lp_in[i]
            values[new, 0] = val_in[i]
            rewards[new, 0] = rew_in[i]
            dones[new, 0] = done_in[i]
            bootstrap[new, 0] = boot_in[i]
            versions[new] = version
            for k in range(state_size):
                states[new, k] = state_in[i, k]
            ep_indices[a] = new
            t = 1
            completed += 1
        ep_lengths[a] = t
    return completed


@numba.njit(cache=True)
def _pop_full_kernel(full_ring, rings, row_state, out):
    """Move up to ``len(out)`` oldest full rows into ``out``; return how many."""
    num_rows = full_ring.shape[0]
    k = min(out.shape[0], rings[_FULL_COUNT])
    head = rings[_FULL_HEAD]
    for j in range(k):
        row = full_ring[(head + j) % num_rows]
        out[j] = row
        row_state[row] = _SHIPPED
    rings[_FULL_HEAD] = (head + k) % num_rows
    rings[_FULL_COUNT] -= k
    return k


@numba.njit(cache=True)
def _release_kernel(rows, free_ring, rings, row_state):
    """Push shipped rows back onto FREE; return 0, or an error code with nothing modified."""
    num_rows = free_ring.shape[0]
    for j in range(rows.shape[0]):
        r = rows[j]
        if r < 0 or r >= num_rows or row_state[r] != _SHIPPED:
            for q in range(j):  # undo the marks of this call before failing
                row_state[rows[q]] = _SHIPPED
            return _ERR_BAD_ROW
        row_state[r] = _FREE  # marking now also rejects a row repeated within this call
    for j in range(rows.shape[0]):
        free_ring[(rings[_FREE_HEAD] + rings[_FREE_COUNT]) % num_rows] = rows[j]
        rings[_FREE_COUNT] += 1
    return 0


def _poison(arr: np.ndarray) -> np.ndarray:
    """Fill ``arr`` so uninitialised reads stand out: NaN for floats, 0xA5 bytes otherwise."""
    if np.issubdtype(arr.dtype, np.floating):
        arr.fill(np.nan)
    else:
        arr.view(np.uint8).fill(0xA5)
    return arr


class RowAssembler:
    """Fixed pool of ``num_rows`` rows of ``horizon`` steps, cycled through FREE and FULL rings."""

    def __init__(self, *, num_agents: int, num_rows: int, horizon: int, obs_shape: tuple[int, ...],
                 obs_dtype: str, state_size: int = 0, action_shape: tuple[int, ...] = (),
                 action_dtype: str = "int32", mask_size: int = 0) -> None:
        if num_agents < 1:
            raise ValueError(f"num_agents must be >= 1, got {num_agents}")
        if num_rows < 2 * num_agents:
            raise ValueError(
                f"row buffer too small: {num_agents} agents need at least {2 * num_agents} rows "
                f"(one being written and one free per agent), got {num_rows}")
        if horizon < 2:
            raise ValueError(f"horizon must be >= 2 (bptt_horizon + 1), got {horizon}")
        self.num_agents, self.num_rows, self.horizon = num_agents, num_rows, horizon
        self.obs_shape = tuple(int(d) for d in obs_shape)
        self.obs_size = int(np.prod(self.obs_shape, dtype=np.int64))
        R, H = num_rows, horizon
        self.obs = _poison(np.empty((R, H, self.obs_size), dtype=np.dtype(obs_dtype)))
        self.action_shape = tuple(int(d) for d in action_shape)
        self.action_size = int(np.prod(self.action_shape, dtype=np.int64))
        self.actions = np.full((R, H, self.action_size), -1 if np.dtype(action_dtype).kind == "i" else np.nan,
                               dtype=np.dtype(action_dtype))  # -1: no discrete action is negative
        self.mask_size = int(mask_size)
        self.masks = _poison(np.empty((R, H, self.mask_size), dtype=np.uint8))
        self.logprobs = np.full((R, H), np.nan, dtype=np.float32)
        self.values = np.full((R, H), np.nan, dtype=np.float32)
        self.rewards = np.full((R, H), np.nan, dtype=np.float32)
        self.dones = np.full((R, H), 0xFF, dtype=np.uint8)
        self.bootstrap = np.full((R, H), np.nan, dtype=np.float32)
        self.versions = np.full(R, -1, dtype=np.int64)
        self.state_size = int(state_size)
        self.states = np.full((R, self.state_size), np.nan, dtype=np.float32)
        self.free_ring = np.arange(R, dtype=np.int64)
        self.full_ring = np.full(R, -1, dtype=np.int64)
        self.rings = np.array([0, R, 0, 0], dtype=np.int64)  # free head/count, full head/count
        self.row_state = np.full(R, _FREE, dtype=np.int8)
        # Every agent takes one row from the free ring.
        self.ep_indices = self.free_ring[:num_agents].copy()
        self.ep_lengths = np.zeros(num_agents, dtype=np.int64)
        self.rings[_FREE_HEAD] = num_agents
        self.rings[_FREE_COUNT] = R - num_agents
        self.row_state[self.ep_indices] = _WRITING
        self._seen = np.full(num_agents, -1, dtype=np.int64)  # duplicate-agent detection scratch
        self._stamp = 0

    def free_rows(self) -> int:
        """Rows available for agents to move into."""
        return int(self.rings[_FREE_COUNT])

    def full_rows(self) -> int:
        """Completed rows waiting to be popped."""
        return int(self.rings[_FULL_COUNT])

    def can_accept(self, num_steps: int) -> bool:
        """Whether ``num_steps`` agent steps surely fit (each completes at most one row)."""
        return self.free_rows() >= num_steps

    def add_steps(self, agent_ids: np.ndarray, obs: np.ndarray, actions: np.ndarray,
                  logprobs: np.ndarray, values: np.ndarray, rewards: np.ndarray, dones: np.ndarray,
                  bootstrap: np.ndarray, version: int, states: np.ndarray | None = None,
                  action_masks: np.ndarray | None = None) -> int:
        """Append one step for each of the distinct ``agent_ids``; return the number of rows completed.

        ``actions`` are [n, *action_shape]. ``states`` [n, state_size] is each agent's recurrent state before
        this step's forward pass (only kept where the step opens a row); ``action_masks`` [n, mask_size] the
        masks the actions were sampled under. Either may be omitted when its width is 0.

        All-or-nothing: on error (RuntimeError for an exhausted free ring, ValueError for bad or
        repeated agent ids) no state is modified.
        """
        ids = np.ascontiguousarray(agent_ids, dtype=np.int64).reshape(-1)
        n = ids.shape[0]
        obs = np.asarray(obs)
        if obs.shape != (n, *self.obs_shape):
            raise ValueError(f"obs shape {obs.shape} != {(n, *self.obs_shape)}")
        if not np.can_cast(obs.dtype, self.obs.dtype, casting="same_kind"):
            raise TypeError(f"obs dtype {obs.dtype} cannot be stored as {self.obs.dtype}")
        obs2 = np.ascontiguousarray(obs, dtype=self.obs.dtype).reshape(n, self.obs_size)
        acts = np.asarray(actions)
        if acts.shape != (n, *self.action_shape):
            raise ValueError(f"actions shape {acts.shape} != {(n, *self.action_shape)}")
        acts = np.ascontiguousarray(acts, dtype=self.actions.dtype).reshape(n, self.action_size)
        if action_masks is None and self.mask_size == 0:
            action_masks = np.empty((n, 0), dtype=np.uint8)
        mask_in = np.ascontiguousarray(action_masks, dtype=np.uint8)
        if mask_in.shape != (n, self.mask_size):
            raise ValueError(f"action_masks shape {mask_in.shape} != {(n, self.mask_size)}")
        cols = [np.ascontiguousarray(x, dtype=dt).reshape(-1) for x, dt in (
            (logprobs, np.float32), (values, np.float32),
            (rewards, np.float32), (dones, np.uint8), (bootstrap, np.float32))]
        for c in cols:
            if c.shape[0] != n:
                raise ValueError(f"per-step field has {c.shape[0]} entries, expected {n}")
        if states is None and self.state_size == 0:
            states = np.empty((n, 0), dtype=np.float32)
        state_in = np.ascontiguousarray(states, dtype=np.float32)
        if state_in.shape != (n, self.state_size):
            raise ValueError(f"states shape {state_in.shape} != {(n, self.state_size)}")
        self._stamp += 1
        rc = _add_steps_kernel(ids, obs2, acts, mask_in, *cols, state_in, np.int64(version),
                               self.obs, self.actions, self.masks, self.logprobs, self.values, self.rewards,
                               self.dones, self.bootstrap, self.versions, self.states, self.ep_indices,
                               self.ep_lengths, self.free_ring, self.full_ring, self.rings,
                               self.row_state, self._seen, np.int64(self._stamp))
        if rc == _ERR_NO_FREE:
            raise RuntimeError(f"row assembler out of free rows ({self.free_rows()} free, "
                               f"{self.full_rows()} full); check can_accept() before add_steps()")
        if rc == _ERR_BAD_AGENT:
            raise ValueError(f"agent id out of range [0, {self.num_agents})")
        if rc == _ERR_DUP_AGENT:
            raise ValueError("agent_ids must be distinct within one add_steps call")
        return int(rc)

    def pop_full(self, max_rows: int) -> np.ndarray:
        """Remove and return up to ``max_rows`` full row indices (int64), oldest first."""
        out = np.empty(max(0, min(int(max_rows), self.full_rows())), dtype=np.int64)
        k = _pop_full_kernel(self.full_ring, self.rings, self.row_state, out)
        return out[:k]

    def release(self, rows: np.ndarray) -> None:
        """Give shipped rows (from ``pop_full``) back to the FREE ring. Rejects any other row."""
        r = np.ascontiguousarray(rows, dtype=np.int64).reshape(-1)
        if _release_kernel(r, self.free_ring, self.rings, self.row_state) != 0:
            raise ValueError("release() takes only rows returned by pop_full() and not yet released")

    def discard_agents(self, agent_ids: np.ndarray) -> None:
        """Drop the partially written rows of these agents; each keeps its row and restarts at 0."""
        ids = np.asarray(agent_ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_agents):
            raise ValueError(f"agent id out of range [0, {self.num_agents})")
        self.ep_lengths[ids] = 0

    def gather(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """Copies of all fields for ``rows``; obs comes back as [n, horizon, *obs_shape]."""
        r = np.asarray(rows, dtype=np.int64).reshape(-1)
        return {
            "obs": self.obs[r].reshape(r.shape[0], self.horizon, *self.obs_shape),
            "actions": self.actions[r].reshape(r.shape[0], self.horizon, *self.action_shape),
            "action_masks": self.masks[r],
            "logprobs": self.logprobs[r],
            "values": self.values[r],
            "rewards": self.rewards[r],
            "dones": self.dones[r],
            "bootstrap": self.bootstrap[r],
            "versions": self.versions[r],
            "states": self.states[r],
        }
