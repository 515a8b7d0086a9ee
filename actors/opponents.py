"""Self-play opponents on an actor host: seats, per-env opponent assignments, and a bounded snapshot cache.

Every env of the host has one learner seat and ``num_agents - 1`` opponent seats. Seats alternate between
envs (env ``e``'s learner plays seat ``e % num_agents``), so the learner plays first and second equally in
two-player games. At each alternation the host asks the opponent-pool server which snapshot every env plays
(``OpponentAssignment``); ``OpponentCache`` downloads each *unique* missing snapshot once and keeps a bounded
number of them. ``Opponents.act`` then runs each opponent once on exactly the agents it controls in the
ready envs: 16 envs with 10 unique snapshots cost one batched forward pass per step (``actors.opponent_batch``:
vmap over the 10 snapshots' stacked weights), not 16 and not 10.

The pool server may also name a fixed baseline (``selfplay.baseline_opponents``): a digest ``baseline:<name>``
(``configs.baselines.BASELINE_DIGEST_PREFIX``; a name of ``configs.baselines``, an entry point too), which the cache
builds here (``envs.baseline_players``) instead of downloading anything.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from safetensors.numpy import load as load_safetensors
from torch import nn

from envs.base import EnvSpec
from actors.inference import Inference
from actors.opponent_batch import SnapshotBatch
from configs.baselines import BASELINE_DIGEST_PREFIX
from configs.schema import ModelSection
from envs.baseline_players import baseline_player


@dataclass(frozen=True, kw_only=True)
class OpponentAssignment:
    """What the pool server answered for one alternation."""

    alternation: int
    """The alternation's number (counts up on the server)."""
    digests: tuple[str, ...]
    """Snapshot (sha256 of its weights file) each env of this host plays, by env index."""
    indices: tuple[int, ...]
    """The same snapshots as pool indices (0 = oldest)."""


def learner_seats(num_envs: int, num_agents: int) -> np.ndarray:
    """[num_envs * num_agents] bool, True on the learner's slot of each env: seat ``e % num_agents`` of env e."""
    seats = np.zeros((num_envs, num_agents), dtype=bool)
    seats[np.arange(num_envs), np.arange(num_envs) % num_agents] = True
    return seats.reshape(-1)


def policy_from_file(data: bytes, digest: str) -> dict[str, np.ndarray]:
    """The weights in a snapshot file, after checking the file is the one its digest names."""
    actual = hashlib.sha256(data).hexdigest()
    if actual != digest:
        raise ValueError(f"snapshot {digest[:12]}: received bytes hash to {actual[:12]}; refusing them")
    return load_safetensors(data)


class Player(Protocol):
    """An opponent: actions for the rows of the seats it plays."""

    def act(self, obs: np.ndarray, masks: np.ndarray | None) -> np.ndarray:
        """Actions [n, *action_shape] for observations [n, *obs_shape] under masks (None: no masks)."""
        ...


class SnapshotOpponent:
    """A pool snapshot playing opponent seats: its policy, sampling its actions as the learner's does."""

    def __init__(self, policy: Inference) -> None:
        self.policy = policy

    def act(self, obs: np.ndarray, masks: np.ndarray | None) -> np.ndarray:
        """Sampled actions for a batch of observations (feed-forward: no recurrent state)."""
        states = np.zeros((len(obs), self.policy.state_size), dtype=np.float32)
        return self.policy.decide(obs, states, masks).actions


def opponent_for(digest: str, *, build_snapshot: Callable[[str], Inference], seed: int) -> Player:
    """The opponent a pool assignment's digest names: a fixed baseline (``baseline:<name>``) or a snapshot."""
    if digest.startswith(BASELINE_DIGEST_PREFIX):
        name = digest[len(BASELINE_DIGEST_PREFIX):]
        return baseline_player(name, seed=seed, error=ValueError,
                               where=f"pool assignment names an opponent this host cannot play: baseline {name!r}")
    return SnapshotOpponent(build_snapshot(digest))


class OpponentCache:
    """Opponents by digest (snapshot policies and baselines), at most ``capacity`` kept beyond those in use (least
    recently used go). Only snapshots are downloaded (``downloads`` counts them)."""

    def __init__(self, spec: EnvSpec, model: ModelSection, *, capacity: int,
                 fetch: Callable[[str], bytes], seed: int) -> None:
        self.spec, self.model, self.capacity, self.fetch, self.seed = spec, model, capacity, fetch, seed
        self.policies: OrderedDict[str, Player] = OrderedDict()
        self.downloads = 0
        self.built = 0

    def ensure(self, digests: Iterable[str]) -> None:
        """Have every one of ``digests`` loaded, downloading each missing one once; then trim the cache."""
        wanted = list(dict.fromkeys(digests))
        for digest in wanted:
            if digest in self.policies:
                self.policies.move_to_end(digest)
                continue
            self.built += 1
            self.policies[digest] = opponent_for(digest, build_snapshot=self._download, seed=self.seed + self.built)
        in_use = set(wanted)
        for digest in list(self.policies):
            if len(self.policies) <= max(self.capacity, len(in_use)):
                break
            if digest not in in_use:
                del self.policies[digest]

    def __getitem__(self, digest: str) -> Player:
        return self.policies[digest]

    def _download(self, digest: str) -> Inference:
        arrays = policy_from_file(self.fetch(digest), digest)
        self.downloads += 1
        policy = Inference(self.spec, self.model, seed=self.seed + self.built)
        policy.load(0, arrays)
        return policy


class Opponents:
    """Which slots are the learner's, which snapshot each env plays, and the opponents' actions."""

    def __init__(self, *, num_envs: int, num_agents: int, cache: OpponentCache) -> None:
        self.num_agents = num_agents
        self.learner_slots = learner_seats(num_envs, num_agents)
        self.cache = cache
        self.env_digests: np.ndarray = np.full(num_envs, "", dtype=object)
        self.next_digests: np.ndarray | None = None
        self.waiting = np.zeros(num_envs, dtype=bool)
        self.assignment: OpponentAssignment | None = None
        self.batch: SnapshotBatch | None = None
        """Runs the step's snapshots as one forward pass when there are several."""

    def assign(self, assignment: OpponentAssignment) -> None:
        """Start an alternation. The first one applies at once; later ones reach each env at its next episode
        end, so no game changes opponent halfway. Downloads only the snapshots not in the cache."""
        if len(assignment.digests) != len(self.env_digests):
            raise ValueError(f"opponent assignment for {len(assignment.digests)} envs, this host has "
                             f"{len(self.env_digests)}")
        incoming = np.asarray(assignment.digests, dtype=object)
        first = self.assignment is None
        self.cache.ensure([*(() if first else self.env_digests.tolist()), *assignment.digests])
        if first:
            self.env_digests = incoming
        else:
            self.next_digests = incoming
            self.waiting = np.ones(len(incoming), dtype=bool)
        self.assignment = assignment

    def episodes_ended(self, agent_ids: np.ndarray) -> None:
        """These slots' episodes just ended: their envs take up the waiting assignment, if any."""
        if self.next_digests is None:
            return
        envs = np.unique(agent_ids // self.num_agents)
        envs = envs[self.waiting[envs]]
        self.env_digests[envs] = self.next_digests[envs]
        self.waiting[envs] = False
        if not self.waiting.any():
            self.next_digests = None

    def act(self, agent_ids: np.ndarray, obs: np.ndarray, masks: np.ndarray | None) -> np.ndarray:
        """Actions of the opponent-controlled ``agent_ids``: each baseline on its rows, and one batched forward pass
        for all the pool snapshots among them (a plain one when there is a single snapshot)."""
        envs = agent_ids // self.num_agents
        digests = self.env_digests[envs]
        actions = np.zeros((len(agent_ids), *self.cache.spec.action.shape), dtype=self.cache.spec.action.dtype)
        snapshots: dict[str, np.ndarray] = {}
        for digest in dict.fromkeys(digests.tolist()):
            rows = np.flatnonzero(digests == digest)
            opponent = self.cache[digest]
            if isinstance(opponent, SnapshotOpponent):
                snapshots[digest] = rows
            else:
                actions[rows] = opponent.act(obs[rows], None if masks is None else masks[rows])
        if len(snapshots) == 1:
            (digest, rows), = snapshots.items()
            actions[rows] = self.cache[digest].act(obs[rows], None if masks is None else masks[rows])
        elif snapshots:  # one batched forward pass for all of them
            stacked = self._snapshots_in_use()
            if self.batch is None:
                self.batch = SnapshotBatch(next(iter(stacked.values())).distribution, seed=self.cache.seed)
            groups = list(snapshots.values())
            decided = self.batch.act(stacked, list(snapshots), [obs[rows] for rows in groups],
                                     None if masks is None else [masks[rows] for rows in groups])
            for rows, group_actions in zip(groups, decided):
                actions[rows] = group_actions.reshape(actions[rows].shape)
        return actions

    def _snapshots_in_use(self) -> dict[str, nn.Module]:
        """Digest -> policy of every snapshot the envs play now or will take up at their next episode end (so the
        set stays the same through an alternation's switch-over), sorted by digest."""
        digests = set(self.env_digests.tolist())
        if self.next_digests is not None:
            digests.update(self.next_digests.tolist())
        players = {digest: self.cache[digest] for digest in sorted(digests)}
        return {digest: player.policy.policy for digest, player in players.items()
                if isinstance(player, SnapshotOpponent)}

    def unique_opponents(self) -> int:
        """Distinct snapshots this host's envs play in the current alternation."""
        return len(set(self.env_digests.tolist()))
