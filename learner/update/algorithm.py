"""The training algorithm as the learner's update loop sees it.

The loop (learner/trainer.py) owns everything around an update: waiting for a batch, the policy version,
publishing weights, the opponent pool, metrics, checkpoints and stop rules. An ``Algorithm`` owns the update
and what it learns: its networks, optimizers and schedules, and whatever else its updates need. PPO
(learner/ppo/algorithm.py) is the one there is; a second algorithm implements the same three methods.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from torch import nn

from learner.run.checkpoint import LearnedState
from learner.update.batch import RowBatch


class Algorithm(ABC):
    """Learns from batches of rows; hands its acting policy to the loop and its state to checkpoints."""

    policy: nn.Module
    """The acting policy: the weights the learner publishes to actor hosts and snapshots into the pool."""

    @abstractmethod
    def update(self, batch: RowBatch, *, update_index: int) -> dict[str, float]:
        """Learn from one batch; returns the update's metrics (their keys go into metrics.jsonl as they are).

        ``update_index`` counts the run's updates before this one, resumes included: schedules follow it."""

    @abstractmethod
    def state_dict(self) -> LearnedState:
        """Everything a checkpoint keeps of the algorithm, by file name (the files of a run never change)."""

    @abstractmethod
    def load_state_dict(self, state: LearnedState) -> None:
        """Continue from the ``state_dict()`` a checkpoint kept."""

    def replicated(self) -> nn.Module:
        """What every data-parallel learner rank must hold identically (rank 0's copy is broadcast to the others when
        the ranks start): the policy, unless the algorithm trains more networks than it publishes."""
        return self.policy
