"""A small real PettingZoo AEC env for the AEC adapter's tests, importable as an entry point
('tests.fake_aec_envs:Knockout'). Deterministic, so tests can write down exact expected rewards."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv


class Knockout(AECEnv):
    """Three agents a, b, c move in turn (a, b, c, a, ...); action 0 or 1.

    The mover gets ``1 + action``, every other agent still in the game 0.5. Agent c is knocked out by its own move
    (terminated, its reward 10 instead), after which AEC wants a dead step for it before the others go on. The game
    ends (every agent terminated) after ``length`` live moves. Observation [3] int64: (live moves so far, the
    observer's index, 7).
    """

    metadata = {"name": "knockout_v0", "is_parallelizable": False}

    def __init__(self, length: int = 5) -> None:
        super().__init__()
        self.length = length
        self.possible_agents = ["a", "b", "c"]
        self.received: list[tuple[str, int]] = []
        """(agent, action) of every live move, in order (dead steps are not in it)."""
        self.dead_steps = 0

    def observation_space(self, agent: str) -> spaces.Space:
        return spaces.Box(low=0, high=100, shape=(3,), dtype=np.int64)

    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Discrete(2)

    def observe(self, agent: str) -> np.ndarray:
        return np.array([self.turn, self.possible_agents.index(agent), 7], dtype=np.int64)

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        self.agents = list(self.possible_agents)
        self.rewards = dict.fromkeys(self.agents, 0.0)
        self._cumulative_rewards = dict.fromkeys(self.agents, 0.0)
        self.terminations = dict.fromkeys(self.agents, False)
        self.truncations = dict.fromkeys(self.agents, False)
        self.infos = {agent: {} for agent in self.agents}
        self.agent_selection = "a"
        self.turn = 0

    def step(self, action: int | None) -> None:
        agent = self.agent_selection
        if self.terminations[agent] or self.truncations[agent]:
            self.dead_steps += 1
            self._was_dead_step(action)
            return
        self._clear_rewards()
        self.received.append((agent, int(action)))
        self.turn += 1
        for other in self.agents:
            self.rewards[other] = 1.0 + action if other == agent else 0.5
        if agent == "c":
            self.rewards["c"] = 10.0
            self.terminations["c"] = True
        if self.turn >= self.length:
            self.terminations = dict.fromkeys(self.agents, True)
        self._accumulate_rewards()
        self.agent_selection = self.agents[(self.agents.index(agent) + 1) % len(self.agents)]
        self._deads_step_first()

    def close(self) -> None:
        pass

