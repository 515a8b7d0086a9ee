"""The recurrent policy state of every agent slot on an actor host.

One float32 row of ``state_size`` (zero width for feed-forward policies) per agent slot, zero at start. The
host reads the states of a batch of agents before inference, writes back what the policy returned, and
zeroes an agent's state when its episode ends or its env worker is restarted.
"""

from __future__ import annotations

import numpy as np


class AgentStates:
    """[num_agents, state_size] float32 recurrent states, addressed by agent slot ids."""

    def __init__(self, num_agents: int, state_size: int) -> None:
        self.array = np.zeros((num_agents, state_size), dtype=np.float32)
        self.feed_forward = state_size == 0
        """No state to keep: reads are empty views and writes do nothing (no indexing call per inference step)."""

    def read(self, agent_ids: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """A copy of the states of ``agent_ids`` [n] -> [n, state_size], into ``out`` when given."""
        if self.feed_forward:
            return self.array[:len(agent_ids)] if out is None else out
        if out is None:
            return self.array[agent_ids]
        return np.take(self.array, agent_ids, axis=0, out=out, mode="clip")  # ids are valid slot ids

    def write(self, agent_ids: np.ndarray, states: np.ndarray) -> None:
        """Store the states [n, state_size] of ``agent_ids`` [n]."""
        if not self.feed_forward:
            self.array[agent_ids] = states

    def reset(self, agent_ids: np.ndarray) -> None:
        """Zero the states of ``agent_ids`` (their next step starts a fresh episode)."""
        if not self.feed_forward:
            self.array[agent_ids] = 0.0
