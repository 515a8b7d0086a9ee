"""PettingZoo AEC (turn-based) envs behind Sluice's VecEnv contract, turns carried as the built-in Connect Four does.

``env.entry_point`` names a callable (e.g. ``pettingzoo.classic.tictactoe_v3:env``) called as ``fn(**env.kwargs)``
once per environment; each result must be a ``pettingzoo.AECEnv`` (a ParallelEnv is refused: use ``env.name:
pettingzoo``). With ``N = len(possible_agents)``, agent ``j`` (in ``possible_agents`` order) of env ``e`` is agent
slot ``e * N + j``. The agents' spaces map as ``envs.adapters.gym_spaces`` describes (the classic
``Dict{observation, action_mask}`` fills ``buffers.action_mask``); agents whose spaces differ share one padded layout
(``envs.adapters.agent_spaces``), as in the parallel adapter.

Turns (the contract of ``envs/builtin/connect_four/game.py``, which ``evaluation.arena`` relies on):

* Exactly one slot per env is ``active``: the agent to move (``agent_selection``). Only its action is applied;
  the others' actions are ignored. Its observation and mask are written; an inactive slot's are left as they were
  (it carries no step). An active slot's action that its mask forbids raises an EnvConfigError naming the env,
  slot, agent and action, before any env is stepped (a row whose mask allows nothing is unmasked, as the learner
  treats it).
* Rewards: after every ``env.step`` (dead steps included) each agent's ``env.rewards`` entry is added to what that
  agent has accumulated since its last move (``_cumulative_rewards``, which is private, is never read). A slot's
  reward on its active step is that sum, so each recorded transition runs own move -> the others' moves -> own next
  observation.
* A game ends when no agent is left that is neither terminated nor truncated, or after ``max_steps`` moves when
  ``max_steps > 0`` (the adapter's time limit: every agent still playing is truncated). The step that ends it is the
  last step of EVERY agent's episode: each slot reports ``episode_done`` with its ``episode_return`` (what it got
  this game), ``episode_length`` (its own moves) and ``episode_stats``; then the env is reset (unseeded: the env's
  own generator goes on; ``reset(seed)`` seeds env ``e`` with ``seed + e``). The new game's first mover is active
  at once and gets its terminal reward now (with ``terminated``, or ``truncated`` and ``final_obs``) together with
  its first observation; every other slot's terminal reward and flags (and ``final_obs``) are HELD and written on
  its next active step. A slot that did not move at all in a game reports no episode for it (it had no step) and
  the rewards it got in that game are dropped; ``0 < max_steps < N`` is refused, since some agent could never move.
* Rewards a slot gets in a new game before its first move are added to the reward of that first move (its first
  active step carries only the held terminal reward of the game before).
* Dead steps (AEC's ``step(None)`` for an agent already terminated or truncated while the game goes on, e.g. a
  player knocked out of a three-player game) are taken here, never exposed; such an agent's episode still ends
  with the game. A truncated agent's ``final_obs`` is its observation when its truncation is first seen (zeros if
  the env dropped it from ``env.agents`` on that very step).

Episode statistics: ``moves`` (moves in the game); for two agents also ``first_player_won``, ``second_player_won``
and ``draw`` (0/1, first in that order, as Connect Four's) from the game's returns of seat 0 and seat 1
(``possible_agents[0]``, who moves first in PettingZoo's classic games, and ``[1]``): the seat with the higher
return won, equal returns are a draw; a game in which any agent was truncated counts as none of the three.
There is no global state (``state_size`` 0).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
from pettingzoo import AECEnv, ParallelEnv

from envs.base import EnvSpec, StepBuffers
from envs.adapters.entry_point import resolve_entry_point
from envs.adapters.gym_spaces import close_each, reward_value, rendered_frame
from envs.adapters.pettingzoo_adapter import open_envs
from envs.errors import EnvConfigError, EnvRaised

TWO_PLAYER_STATS = ("first_player_won", "second_player_won", "draw")
"""Statistics of a two-agent game, before ``moves``."""
PLAYING, TERMINATED, TRUNCATED = 0, 1, 2
"""How an agent's part in a game stands (``_ended``, ``_held``)."""


class PettingZooAECAdapter:
    """``num_envs`` PettingZoo AEC envs, one move of each per step, into caller-owned StepBuffers."""

    def __init__(self, entry_point: str, num_envs: int, *, max_steps: int, kwargs: dict[str, Any],
                 obs_keys: Sequence[str] = ()) -> None:
        """Build ``num_envs`` envs with the entry point and read their agents and spaces; ``obs_keys``: the top-level
        keys of a Dict observation to keep (all when empty), as the other adapters."""
        if num_envs <= 0:
            raise EnvConfigError(f"PettingZooAECAdapter needs num_envs >= 1, got {num_envs}")
        fn = resolve_entry_point(entry_point, env_name="pettingzoo_aec")
        self.label = f"pettingzoo_aec env '{entry_point}'"
        self.num_envs = num_envs
        self._envs, self.agents, self._spaces = open_envs(self.label, lambda e: self._make(fn, kwargs, e), num_envs,
                                                          obs_keys=obs_keys)
        n = len(self.agents)
        if 0 < max_steps < n:
            self.close()
            raise EnvConfigError(f"env.max_steps for {self.label} must be >= {n} (its agent count) or <= 0 for no "
                                 f"limit, got {max_steps}: with fewer moves per game some agent would never move")
        self.max_steps = max(max_steps, 0)
        stats = (*TWO_PLAYER_STATS, "moves") if n == 2 else ("moves",)
        self.spec: EnvSpec = dataclasses.replace(self._spaces.spec, episode_stats=stats)
        slots = num_envs * n
        obs_shape, obs_dtype = (slots, *self.spec.obs_shape), self.spec.obs_dtype
        self._index = {agent: j for j, agent in enumerate(self.agents)}
        self._mover = np.zeros(num_envs, dtype=np.int64)
        self._game_moves = np.zeros(num_envs, dtype=np.int64)
        self._pending = np.zeros(slots, dtype=np.float64)
        self._returns = np.zeros(slots, dtype=np.float64)
        self._moves = np.zeros(slots, dtype=np.int64)
        self._ended = np.zeros(slots, dtype=np.int8)
        self._final = np.zeros(obs_shape, dtype=obs_dtype)
        self._held = np.zeros(slots, dtype=np.int8)
        self._held_reward = np.zeros(slots, dtype=np.float32)
        self._held_final = np.zeros(obs_shape, dtype=obs_dtype)
        self._mask = np.ones((slots, self.spec.mask_size), dtype=np.uint8)
        self._was_reset = False

    def _make(self, fn: Any, kwargs: dict[str, Any], index: int) -> Any:
        """Call the entry point once; check it built an AECEnv."""
        try:
            env = fn(**kwargs)
        except Exception as exc:
            raise EnvRaised(f"{self.label} (env {index}) raised in make(): {exc!r}") from exc
        if not isinstance(env, AECEnv):
            kind = f"{type(env).__module__}.{type(env).__qualname__}"
            with contextlib.suppress(Exception):  # it is not ours to use; closing is best effort
                env.close()
            hint = ("it is a ParallelEnv: use env.name: pettingzoo for it" if isinstance(env, ParallelEnv) else
                    "for a ParallelEnv use env.name: pettingzoo, for a Gymnasium env env.name: gymnasium")
            raise EnvConfigError(f"{self.label}: the entry point returned a {kind}, not a pettingzoo AECEnv ({hint})")
        return env

    # ----- one env's game -----

    def _observe(self, e: int, agent: str, call: str) -> tuple[np.ndarray, np.ndarray | None]:
        """``agent``'s observation and mask in env ``e``, validated."""
        try:
            raw = self._envs[e].observe(agent)
        except Exception as exc:
            raise EnvRaised(f"{self.label} (env {e}) raised in observe({agent!r}) {call}: {exc!r}") from exc
        return self._spaces.obs_and_mask(self._index[agent], raw, call="observe",
                                         where=f"(env {e}, agent {agent!r}, {call})")

    def _live(self, e: int) -> list[str]:
        """The agents of env ``e`` still playing: in ``env.agents``, neither terminated nor truncated."""
        env = self._envs[e]
        return [agent for agent in env.agents
                if not env.terminations.get(agent, False) and not env.truncations.get(agent, False)]

    def _env_step(self, e: int, action: Any) -> None:
        """``env.step(action)``; add every agent's reward to its sums; note the agents whose part just ended."""
        env, base = self._envs[e], e * len(self.agents)
        try:
            env.step(action)
        except Exception as exc:
            raise EnvRaised(f"{self.label} (env {e}) raised in step(): {exc!r}") from exc
        for agent, raw in env.rewards.items():
            if agent in self._index:
                slot = base + self._index[agent]
                reward = reward_value(raw, lambda: f"{self.label} (env {e}, agent {agent!r}) step()")
                self._pending[slot] += reward
                self._returns[slot] += reward
        present = set(env.agents)
        for j, agent in enumerate(self.agents):
            slot = base + j
            if self._ended[slot] != PLAYING:
                continue
            if env.terminations.get(agent, False):
                self._ended[slot] = TERMINATED
            elif env.truncations.get(agent, False):
                self._ended[slot] = TRUNCATED
                present_now = agent in present  # an env that dropped it at once has no observation of it left
                self._final[slot] = self._observe(e, agent, "when truncated")[0] if present_now else 0
            elif agent not in present:
                raise EnvConfigError(f"{self.label} (env {e}, agent {agent!r}) step() removed the agent from "
                                     f"env.agents without terminating or truncating it")

    def _skip_dead(self, e: int) -> bool:
        """Take the dead steps of env ``e`` until a live agent is to move; False when no agent is left playing."""
        env = self._envs[e]
        for _ in range(len(self.agents) + 1):
            live = self._live(e)
            if not live:
                return False
            if env.agent_selection in live:
                return True
            self._env_step(e, None)
        raise EnvConfigError(f"{self.label} (env {e}): agent_selection {env.agent_selection!r} stayed on finished "
                             f"agents after {len(self.agents) + 1} dead steps")

    def _activate(self, e: int, buffers: StepBuffers) -> None:
        """Make env ``e``'s agent to move its only active slot: its observation, mask and reward (held or not)."""
        env, n = self._envs[e], len(self.agents)
        agent = env.agent_selection
        if agent not in self._index:
            raise EnvConfigError(f"{self.label} (env {e}): agent_selection {agent!r} is not one of possible_agents "
                                 f"{list(self.agents)}")
        j = self._index[agent]
        base, slot = e * n, e * n + j
        self._mover[e] = j
        buffers.active[base:base + n] = False
        buffers.active[slot] = True
        obs, mask = self._observe(e, agent, "to move")
        buffers.obs[slot] = obs
        if mask is not None:
            buffers.action_mask[slot] = mask
            self._mask[slot] = mask
        if self._held[slot] != PLAYING:  # the end of its last game, held since then
            buffers.rewards[slot] = self._held_reward[slot]
            buffers.terminated[slot] = self._held[slot] == TERMINATED
            buffers.truncated[slot] = self._held[slot] == TRUNCATED
            if self._held[slot] == TRUNCATED:
                buffers.final_obs[slot] = self._held_final[slot]
            self._held[slot] = PLAYING
            self._held_reward[slot] = 0.0
        else:
            buffers.rewards[slot] = self._pending[slot]
            self._pending[slot] = 0.0

    def _end_game(self, e: int, buffers: StepBuffers) -> None:
        """Report every slot's episode, hold its terminal reward and flags, reset env ``e`` and activate its mover."""
        n = len(self.agents)
        base = e * n
        slots = slice(base, base + n)
        stats = self._stats(e)
        for slot in range(base, base + n):
            if self._moves[slot]:
                buffers.episode_done[slot] = True
                buffers.episode_return[slot] = self._returns[slot]
                buffers.episode_length[slot] = self._moves[slot]
                buffers.episode_stats[slot] = stats
                self._held[slot] = max(self._ended[slot], TERMINATED)
                self._held_reward[slot] = self._pending[slot]
                if self._ended[slot] == TRUNCATED:
                    self._held_final[slot] = self._final[slot]
        self._pending[slots] = 0.0
        self._returns[slots] = 0.0
        self._moves[slots] = 0
        self._ended[slots] = PLAYING
        self._reset_env(e, None, " (auto-reset during step())")
        self._activate(e, buffers)

    def _stats(self, e: int) -> np.ndarray:
        """The episode statistics of env ``e``'s game that just ended (see the module docstring)."""
        n = len(self.agents)
        base = e * n
        stats = np.zeros(len(self.spec.episode_stats), dtype=np.float32)
        stats[-1] = self._game_moves[e]
        if n == 2 and not (self._ended[base:base + 2] == TRUNCATED).any():
            first, second = self._returns[base], self._returns[base + 1]
            stats[:3] = (first > second, second > first, first == second)
        return stats

    def _reset_env(self, e: int, seed: int | None, during: str) -> None:
        """Reset env ``e`` (its game's move count too); EnvConfigError if no agent is left to play."""
        try:
            self._envs[e].reset(seed=seed)
        except Exception as exc:
            raise EnvRaised(f"{self.label} (env {e}) raised in reset(){during}: {exc!r}") from exc
        self._game_moves[e] = 0
        if not self._live(e):
            raise EnvConfigError(f"{self.label} (env {e}) reset(){during} left no agent to play (env.agents "
                                 f"{list(self._envs[e].agents)})")

    # ----- the VecEnv contract -----

    def reset(self, buffers: StepBuffers, seed: int) -> None:
        """Reset env ``e`` with seed ``seed + e``; each env's agent to move is its only active slot."""
        buffers.clear_step_outputs()
        for array in (self._pending, self._returns, self._moves, self._ended, self._held, self._held_reward):
            array[:] = 0
        for e in range(self.num_envs):
            self._reset_env(e, seed + e, "")
            self._activate(e, buffers)
        self._was_reset = True

    def step(self, buffers: StepBuffers) -> None:
        """Apply each env's mover's action; write results; deliver held episode ends; reset finished games."""
        if not self._was_reset:
            raise RuntimeError(f"{self.label}: step() called before reset()")
        n = len(self.agents)
        movers = np.arange(self.num_envs) * n + self._mover
        self._spaces.check_actions(buffers.actions[movers], self._mover,
                                   lambda row: f"(env {row}, agent slot {movers[row]}, "
                                               f"{self.agents[self._mover[row]]!r} to move)")
        self._check_legal(buffers.actions, movers)
        for name in ("rewards", "terminated", "truncated", "episode_done", "episode_return", "episode_length",
                     "episode_stats"):
            getattr(buffers, name)[:] = 0
        for e in range(self.num_envs):
            slot = movers[e]
            self._env_step(e, self._spaces.to_env_action(int(self._mover[e]), buffers.actions[slot]))
            self._moves[slot] += 1
            self._game_moves[e] += 1
            playing = self._skip_dead(e)
            if playing and 0 < self.max_steps <= self._game_moves[e]:
                for agent in self._live(e):
                    cut = e * n + self._index[agent]
                    self._ended[cut] = TRUNCATED
                    self._final[cut] = self._observe(e, agent, "at the time limit")[0]
                playing = False
            if playing:
                self._activate(e, buffers)
            else:
                self._end_game(e, buffers)

    def _check_legal(self, actions: np.ndarray, movers: np.ndarray) -> None:
        """EnvConfigError naming the first mover whose action its mask forbids (nothing stepped yet)."""
        if not self.spec.mask_size:
            return
        nvec = np.asarray(self.spec.action.nvec, dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]])
        for e, slot in enumerate(movers):
            mask = self._mask[slot]
            flags = offsets + np.asarray(actions[slot], dtype=np.int64).reshape(-1)
            if mask.any() and not mask[flags].all():
                agent = self.agents[self._mover[e]]
                legal = np.flatnonzero(mask).tolist()
                raise EnvConfigError(f"{self.label}: env {e}, agent slot {slot} ({agent!r} to move): illegal move, "
                                     f"action {actions[slot].tolist()} is not allowed by its action mask (legal "
                                     f"flags: {legal})")

    def render_first(self) -> np.ndarray:
        """Env 0's current frame as [height, width, 3] uint8, from its ``render()``: the envs must have been made
        with ``render_mode='rgb_array'`` (env.kwargs), as ``python -m evaluation.evaluate --video`` makes them."""
        return rendered_frame(self.label, self._envs[0])

    def close(self) -> None:
        """Close every env made so far (the first failure is re-raised after closing the rest)."""
        envs, self._envs = self._envs, []
        close_each(envs, self.label)
