"""COMA as an ``Algorithm`` of the distributed learner: each batch of team rows is one rollout.

``update`` turns the rollout's rows into joint transitions (``learner.coma.rows``), adds them to the replay buffer,
then takes ``coma.epochs * ceil(transitions / coma.batch_size)`` gradient steps of ``Coma.train_step`` on uniform
minibatches from the buffer, as the serial mode does (``learner.coma.serial``: an epoch is one rollout's worth of
transitions). The acting policy the loop publishes to actor hosts is ``Coma.actors`` (``TeamActors``).

Checkpoint files: ``actors``, ``critic``, ``target_actors``, ``target_critic`` (modules), ``actor_optimizer`` and
``critic_optimizer``, and ``replay``: the replay buffer's transitions oldest first, as plain arrays (at the seed's
100k transitions of 3-agent simple_spread, about 72 MB), so a resumed run keeps learning from what it had. Under K
data-parallel ranks the checkpoint (rank 0's) keeps rank 0's buffer; resumed ranks each take every K-th of it.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from configs.plan import coma_gradient_steps
from configs.schema import ComaSection
from envs.base import EnvSpec
from learner.update.algorithm import Algorithm
from learner.update.batch import RowBatch
from learner.run.checkpoint import LearnedState
from learner.coma.algorithm import Coma, transition_fields
from learner.coma.rows import transitions_from_rows
from learner.update.reducer import SINGLE_PROCESS, Reducer
from learner.coma.replay_buffer import ReplayBuffer
from policies.team_actors import team_shapes

MODULES = ("actors", "critic", "target_actors", "target_critic")
"""Coma's networks, by attribute and checkpoint file name."""
OPTIMIZERS = ("actor_optimizer", "critic_optimizer")
"""Coma's optimizers, by attribute and checkpoint file name."""
REPLAY = "replay"
"""The replay buffer's checkpoint file name."""


class ComaLearner(Algorithm):
    """Coma, its replay buffer and its minibatch sampler."""

    def __init__(self, *, spec: EnvSpec, section: ComaSection, device: torch.device, seed: int,
                 reducer: Reducer = SINGLE_PROCESS) -> None:
        """``seed`` seeds the networks, the target-action sampler and the minibatch draws (the learner passes run.seed
        + the update it starts at, so a resumed run does not replay the first run's draws). With K data-parallel
        ranks (``reducer``; the learner seeds each rank differently and broadcasts rank 0's networks) each rank keeps
        its own rows' transitions in a buffer of ceil(buffer_size / K) and draws coma.batch_size / K of every
        gradient step's transitions from it."""
        self.section = section
        self.device = device
        self.reducer = reducer
        self.coma = Coma(team_shapes(spec), section, seed=seed, device=device)
        self.policy = self.coma.actors
        self.replay = ReplayBuffer(-(-section.buffer_size // reducer.world_size), transition_fields(self.coma.shapes))
        self.rank_batch_size = section.batch_size // reducer.world_size
        self.rng = np.random.default_rng(seed)

    def replicated(self) -> nn.Module:
        """Every network (actors, critic and their targets): the ranks must all start from rank 0's."""
        return self.coma

    def update(self, batch: RowBatch, *, update_index: int) -> dict[str, float]:
        """Add the rollout's transitions to the replay buffer, then the rollout's gradient steps; returns their mean
        metrics, the buffer fill and the counts."""
        section = self.section
        reducer = self.reducer
        transitions = transitions_from_rows(batch, self.coma.low, self.coma.high)
        self.replay.add(transitions)
        local = torch.tensor([len(transitions["state"]), float(transitions["rewards"].sum()),
                              transitions["rewards"].size], dtype=torch.float64)
        added, reward_sum, rewards = (float(x) for x in reducer.sum(local))  # the whole batch's, every rank's rows
        steps = coma_gradient_steps(section, int(added))  # the same on every rank
        sums: dict[str, float] = {}
        for _ in range(steps):
            sample = self.replay.sample(self.rank_batch_size, self.rng)
            minibatch = {name: torch.from_numpy(values).to(self.device) for name, values in sample.items()}
            for name, value in self.coma.train_step(minibatch, reducer).items():
                sums[name] = sums.get(name, 0.0) + value
        names = sorted(sums)
        means = reducer.average(torch.tensor([sums[name] / max(1, steps) for name in names], dtype=torch.float64))
        metrics = dict(zip(names, (float(x) for x in means)))
        metrics.update(buffer_fill=len(self.replay) / self.replay.capacity, transitions_added=added,
                       gradient_steps=float(steps), reward_mean=reward_sum / max(1.0, rewards))
        return metrics

    def state_dict(self) -> LearnedState:
        """The networks, the optimizers and the replay buffer."""
        modules = {name: getattr(self.coma, name).state_dict() for name in MODULES}
        modules[REPLAY] = {key: torch.from_numpy(value) for key, value in self.replay.state_dict().items()}
        return LearnedState(modules=modules,
                            optimizers={name: getattr(self.coma, name).state_dict() for name in OPTIMIZERS})

    def load_state_dict(self, state: LearnedState) -> None:
        """Continue from a checkpoint: networks, optimizers and the replay buffer's transitions."""
        for name in MODULES:
            getattr(self.coma, name).load_state_dict(state.modules[name])
        for name in OPTIMIZERS:
            getattr(self.coma, name).load_state_dict(state.optimizers[name])
        saved = {key: value.numpy() for key, value in state.modules[REPLAY].items()}
        if self.reducer.world_size == 1:
            self.replay.load_state_dict(saved)
        else:  # each rank takes every K-th of the saved transitions (rank 0's: the others' buffers are not saved)
            self.replay.load_share(saved, part=self.reducer.rank, parts=self.reducer.world_size)
