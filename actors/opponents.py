"""Self-play opponents on an actor host: seats, per-env opponent assignments, and a bounded snapshot cache.

Every env of the host has one learner seat and ``num_agents - 1`` opponent seats. Seats alternate between
envs (env ``e``'s learner plays seat ``e % num_agents``), so the learner plays first and second equally in
two-player games. At each alternation the host asks the opponent-pool server which snapshot every env plays
(``OpponentAssignment``); ``OpponentCache`` downloads each *unique* missing snapshot once and keeps a bounded
number of them. ``Opponents.act`` then runs each opponent once on exactly the agents it controls in the
ready envs: 16 envs with 10 unique opponents cost 10 forward passes per step, not 16.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
from safetensors.numpy import load as load_safetensors

from envs.base import EnvSpec
from actors.inference import Inference
from configs.schema import ModelSection


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


class OpponentCache:
    """Snapshot policies by digest, at most ``capacity`` kept beyond those in use (least recently used go)."""

    def __init__(self, spec: EnvSpec, model: ModelSection, *, capacity: int,
                 fetch: Callable[[str], bytes], seed: int) -> None:
        self.spec, self.model, self.capacity, self.fetch, self.seed = spec, model, capacity, fetch, seed
        self.policies: OrderedDict[str, Inference] = OrderedDict()
        self.downloads = 0

    def ensure(self, digests: Iterable[str]) -> None:
        """Have every one of ``digests`` loaded, downloading each missing one once; then trim the cache."""
        wanted = list(dict.fromkeys(digests))
        for digest in wanted:
            if digest in self.policies:
                self.policies.move_to_end(digest)
                continue
            arrays = policy_from_file(self.fetch(digest), digest)
            self.downloads += 1
            policy = Inference(self.spec, self.model, seed=self.seed + self.downloads)
            policy.load(0, arrays)
            self.policies[digest] = policy
        in_use = set(wanted)
        for digest in list(self.policies):
            if len(self.policies) <= max(self.capacity, len(in_use)):
                break
            if digest not in in_use:
                del self.policies[digest]

    def __getitem__(self, digest: str) -> Inference:
        return self.policies[digest]


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
        """Actions of the opponent-controlled ``agent_ids``: one forward pass per unique opponent among them."""
        envs = agent_ids // self.num_agents
        digests = self.env_digests[envs]
        actions = np.zeros((len(agent_ids), *self.cache.spec.action.shape), dtype=self.cache.spec.action.dtype)
        for digest in dict.fromkeys(digests.tolist()):
            rows = np.flatnonzero(digests == digest)
            policy = self.cache[digest]
            states = np.zeros((len(rows), policy.state_size), dtype=np.float32)
            decided = policy.decide(obs[rows], states, None if masks is None else masks[rows])
            actions[rows] = decided.actions
        return actions

    def unique_opponents(self) -> int:
        """Distinct snapshots this host's envs play in the current alternation."""
        return len(set(self.env_digests.tolist()))
