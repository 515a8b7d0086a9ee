"""Head-to-head games between two players on a vectorised two-player turn-based env, in-process and batched.

Used by ``evaluation/elo.py`` to rate self-play snapshots against each other and against baselines. The fixed
Connect Four players (``envs/builtin/connect_four/players.py``, re-exported here): ``RandomPlayer`` (any masked env),
``OnePlyPlayer`` and ``NegamaxPlayer`` (depth-limited search for forced wins and losses); ``baseline_player``
(``envs/baseline_players.py``, re-exported) resolves any baseline name, entry points ``module.path:callable`` too.

Env contract (what ``play_match`` relies on; ``envs/builtin/connect_four/game.py`` implements it, so does
``envs/adapters/pettingzoo_aec_adapter.py`` for a two-player AEC env, and any VecEnv that follows it works too):
``num_agents == 2``, env ``e`` has slots ``2e`` (seat 0, in Connect Four the player who moves first) and ``2e + 1``
(seat 1); on every step only the ``active`` slots' actions matter (the
player to move); the step that ends a game reports ``episode_done`` with ``episode_return`` (> 0 win, < 0
loss, 0 draw) on BOTH slots of that env, and the env auto-resets (a slot's held terminal reward arriving on
a later step is not an episode end and is ignored here). Inactive slots still get a legal action (the first
legal one) so envs that validate every slot are satisfied.

Seats: games are numbered ``g = k * num_envs + e`` (env ``e``'s ``k``-th game), and player ``a`` takes seat 0
in game ``g`` iff ``g`` is even; so ``a`` plays first in exactly ``ceil(episodes / 2)`` games. Each env
counts its first games up to its share of ``episodes`` whatever their length (no bias towards short games);
an env past its share keeps stepping with cheap filler moves until the others finish.

Players draw from their own generators; ``play_match`` reseeds every player that has a ``reseed(seed)``
method (all four here do) from its ``seed``, so a match is reproducible on its own, whatever ran before.

Besides the totals, a ``MatchOutcome`` keeps each counted game's result from ``a``'s side (``returns_a``), ``a``'s
move count (``lengths_a``) and ``a``'s seat (``seats_a``), in the order the games ended; ``python -m
evaluation.evaluate --opponent`` reports them per seat. An ``observer`` sees the env and its buffers after the
reset and after every step while env 0 still has games to count (``--video`` draws its frames from it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from envs.base import EnvSpec, StepBuffers, VecEnv
from envs.baseline_players import baseline_player
from envs.builtin.connect_four.players import NegamaxPlayer, OnePlyPlayer, RandomPlayer
from envs.registry import make_vec_env
from actors.inference import Inference
from configs.env_config import EnvConfig
from configs.schema import ModelSection

MAX_ENVS = 256
"""Envs stepped at once by ``play_match`` (fewer when fewer games are asked for)."""

MatchObserver = Callable[[VecEnv, StepBuffers], None]
"""Called after the reset and after every step while env 0 still has games to count (to draw frames)."""


@runtime_checkable
class Player(Protocol):
    """Anything that picks one action per observation for a batch of agents it controls."""

    name: str
    """How the player is named in tables and plots."""

    def act(self, obs: np.ndarray, masks: np.ndarray) -> np.ndarray:
        """Actions [n, *action_shape] for observations [n, *obs_shape] under masks [n, mask_size] (1 = legal)."""
        ...


__all__ = ["MatchObserver", "MatchOutcome", "NegamaxPlayer", "OnePlyPlayer", "Player", "PolicyPlayer", "RandomPlayer",
           "baseline_player", "play_match"]


class PolicyPlayer:
    """A policy with fixed weights (e.g. a pool snapshot), run through ``actors.inference.Inference``.

    ``greedy=False`` (the default) SAMPLES from the masked policy distribution, as the actors do in training,
    so the rating is that of the policy that actually played; ``greedy=True`` takes the most probable legal
    action (argmax of the masked logits; discrete action spaces only). Feed-forward policies only: the arena
    keeps no per-agent recurrent state, so an ``lstm`` core is refused.
    """

    def __init__(self, name: str, spec: EnvSpec, model: ModelSection, arrays: dict[str, np.ndarray], *,
                 greedy: bool = False, seed: int = 0, version: int = 0) -> None:
        self.name = name
        self.greedy = greedy
        self.inference = Inference(spec, model, seed=seed)
        if self.inference.state_size:
            raise ValueError(f"player {name!r}: the arena plays feed-forward policies only, but model.core "
                             f"{model.core!r} is recurrent (state_size {self.inference.state_size})")
        if greedy and spec.action.kind != "discrete":
            raise ValueError(f"player {name!r}: greedy play needs a discrete action space, "
                             f"not {spec.action.kind}")
        self.inference.load(version, arrays)

    def reseed(self, seed: int) -> None:
        """Restart the action sampler from ``seed``."""
        self.inference.generator.manual_seed(seed)

    def act(self, obs: np.ndarray, masks: np.ndarray) -> np.ndarray:
        """Sampled (or, when greedy, argmax) legal actions for a batch of observations."""
        if not self.greedy:
            states = np.zeros((len(obs), 0), dtype=np.float32)
            return self.inference.decide(obs, states, masks).actions
        with torch.no_grad():
            logits, _, _ = self.inference.policy.step(torch.from_numpy(obs), torch.zeros(len(obs), 0))
        scores = logits.numpy().astype(np.float64)
        if masks is not None and masks.shape[-1]:
            legal = masks != 0
            legal[~legal.any(axis=1)] = True  # as the sampler: a row that allows nothing is unmasked
            scores = np.where(legal, scores, -np.inf)
        return scores.argmax(axis=1).astype(np.int32)


@dataclass(frozen=True, kw_only=True)
class MatchOutcome:
    """Results of a match, from player a's side."""

    wins_a: int
    """Games a won."""
    draws: int
    """Games drawn (including games cut by a time limit)."""
    wins_b: int
    """Games b won."""
    a_first: int = 0
    """Games in which a had seat 0 (moved first in Connect Four)."""
    returns_a: np.ndarray = field(default_factory=lambda: np.zeros(0), compare=False, repr=False)
    """float64 [games]: each counted game's ``episode_return`` on a's slot (> 0 a won), in the order games ended
    (empty when the outcome was built by hand)."""
    lengths_a: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64), compare=False, repr=False)
    """int64 [games]: each counted game's ``episode_length`` on a's slot (a's own moves in Connect Four)."""
    seats_a: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64), compare=False, repr=False)
    """int64 [games]: a's seat in each counted game (0 = moved first)."""

    @property
    def games(self) -> int:
        """Games played."""
        return self.wins_a + self.draws + self.wins_b

    @property
    def score_a(self) -> float:
        """a's score rate: (wins + draws / 2) / games."""
        return (self.wins_a + 0.5 * self.draws) / self.games if self.games else float("nan")


def play_match(a: Player, b: Player, *, episodes: int, env_config: EnvConfig, seed: int = 0,
               num_envs: int | None = None, observer: MatchObserver | None = None) -> MatchOutcome:
    """Play ``episodes`` games of ``a`` against ``b`` on the env ``env_config`` describes, seats alternating
    (``a`` in seat 0 in ``ceil(episodes / 2)`` games), ``min(episodes, 256)`` envs at once unless
    ``num_envs`` says otherwise; see the module docstring for the env contract, how games are counted and
    what ``observer`` sees."""
    if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1:
        raise ValueError(f"episodes must be an integer >= 1, got {episodes!r}")
    n = min(episodes, MAX_ENVS) if num_envs is None else int(num_envs)
    if not 1 <= n <= episodes:
        raise ValueError(f"num_envs must be in [1, episodes={episodes}], got {num_envs!r}")
    seeds = np.random.SeedSequence(seed).generate_state(3)
    for player, player_seed in ((a, seeds[0]), (b, seeds[1])):
        reseed = getattr(player, "reseed", None)
        if callable(reseed):
            reseed(int(player_seed))
    env = make_vec_env(env_config, n)
    try:
        return _play(env, a, b, episodes=episodes, seed=int(seeds[2]), observer=observer)
    finally:
        env.close()


def _play(env: VecEnv, a: Player, b: Player, *, episodes: int, seed: int,
          observer: MatchObserver | None = None) -> MatchOutcome:
    spec, n = env.spec, env.num_envs
    if spec.num_agents != 2:
        raise ValueError(f"play_match needs a two-player env (num_agents 2), this one has {spec.num_agents}")
    buffers = StepBuffers.allocate(spec, n)
    env.reset(buffers, seed)
    envs = np.arange(n)
    quota = (episodes - envs + n - 1) // n  # env e plays games g = k * n + e < episodes
    played = np.zeros(n, dtype=np.int64)
    wins_a = draws = wins_b = a_first = 0
    returns: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    seats: list[np.ndarray] = []
    while (played < quota).any():
        if observer is not None and played[0] < quota[0]:
            observer(env, buffers)
        # Seat of a in each env's current game: seat 0 iff the game's number g = played * n + e is even.
        a_seat = ((played * n + envs) % 2).astype(np.int64)
        a_slot = 2 * envs + a_seat
        owner_a = np.zeros(2 * n, dtype=bool)
        owner_a[a_slot] = True
        counting = np.repeat(played < quota, 2)
        active = buffers.active.astype(bool)
        actions = buffers.actions
        actions[...] = _filler(buffers.action_mask, actions)
        for player, mine in ((a, owner_a), (b, ~owner_a)):
            rows = np.flatnonzero(active & counting & mine)
            if len(rows):
                chosen = np.asarray(player.act(buffers.obs[rows], buffers.action_mask[rows]))
                actions[rows] = chosen.reshape(actions[rows].shape)
        env.step(buffers)
        done = buffers.episode_done[a_slot] & (played < quota)
        if done.any():
            result = buffers.episode_return[a_slot][done]
            wins_a += int((result > 0).sum())
            wins_b += int((result < 0).sum())
            draws += int((result == 0).sum())
            a_first += int((a_seat[done] == 0).sum())
            returns.append(result.astype(np.float64))
            lengths.append(buffers.episode_length[a_slot][done].astype(np.int64))
            seats.append(a_seat[done])
            played[done] += 1
    return MatchOutcome(wins_a=wins_a, draws=draws, wins_b=wins_b, a_first=a_first,
                        returns_a=np.concatenate(returns) if returns else np.zeros(0),
                        lengths_a=np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64),
                        seats_a=np.concatenate(seats) if seats else np.zeros(0, dtype=np.int64))


def _filler(masks: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """The first legal action of each slot (0 where there is no mask): for slots no player decides."""
    if masks.shape[-1] == 0 or actions.ndim != 1:
        return np.zeros_like(actions)
    return (masks != 0).argmax(axis=1).astype(actions.dtype)
