"""COMA as the learner's algorithm (learner/coma/learner.py): a batch of team rows is a rollout that goes into the
replay buffer and is trained on for coma.epochs epochs; a checkpoint keeps networks, optimizers and the replay
buffer, and a learner loaded from it continues exactly where the first left off."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from configs.schema import ComaSection
from learner.update.batch import to_batch
from learner.run.checkpoint import TrainerState, load_checkpoint, save_checkpoint
from learner.coma.learner import ComaLearner
from learner.update.reducer import SingleProcessReducer
from tests.test_coma_rows import SPEC, random_rows

SECTION = ComaSection(batch_size=16, epochs=2, rollout_length=24, buffer_size=50, hidden_sizes=[16])
CPU = torch.device("cpu")


def rollout(seed: int):
    buffers = random_rows(np.random.default_rng(seed), 6, 5)  # 6 rows x 4 transitions
    buffers.arrays["actions"] *= 0.5
    return to_batch(buffers, CPU)


def test_an_update_adds_the_rollout_and_takes_its_gradient_steps() -> None:
    learner = ComaLearner(spec=SPEC, section=SECTION, device=CPU, seed=0)
    before = {k: v.clone() for k, v in learner.policy.state_dict().items()}
    metrics = learner.update(rollout(1), update_index=0)
    assert metrics["transitions_added"] == 24 and len(learner.replay) == 24
    assert metrics["gradient_steps"] == SECTION.epochs * 2  # ceil(24 / 16) per epoch
    assert metrics["buffer_fill"] == 24 / 50
    for key in ("critic_loss", "q_mean", "action_std", "entropy", "actor_loss_0", "advantage_std_2"):
        assert np.isfinite(metrics[key]), key
    assert any(not torch.equal(v, before[k]) for k, v in learner.policy.state_dict().items())
    learner.update(rollout(2), update_index=1)
    learner.update(rollout(3), update_index=2)
    assert len(learner.replay) == 50  # capacity: the oldest went


def test_a_checkpoint_keeps_the_replay_buffer_and_resumes_exactly(tmp_path) -> None:
    first = ComaLearner(spec=SPEC, section=SECTION, device=CPU, seed=0)
    for i in range(3):
        first.update(rollout(i), update_index=i)
    path = save_checkpoint(tmp_path, learned=first.state_dict(), state=TrainerState(update=3), keep=2)
    second = ComaLearner(spec=SPEC, section=SECTION, device=CPU, seed=99)
    second.load_state_dict(load_checkpoint(path).learned)
    for key, value in first.replay.state_dict().items():
        np.testing.assert_array_equal(second.replay.state_dict()[key], value, err_msg=key)
    for name in ("actors", "critic", "target_actors", "target_critic"):
        for key, value in getattr(first.coma, name).state_dict().items():
            assert torch.equal(getattr(second.coma, name).state_dict()[key], value), (name, key)
    # Same replay, weights and Adam moments: the next update from the same draws gives the same weights.
    second.rng, second.coma.generator = np.random.default_rng(7), torch.Generator().manual_seed(7)
    first.rng, first.coma.generator = np.random.default_rng(7), torch.Generator().manual_seed(7)
    first.update(rollout(5), update_index=3)
    second.update(rollout(5), update_index=3)
    for key, value in first.policy.state_dict().items():
        torch.testing.assert_close(second.policy.state_dict()[key], value, rtol=0, atol=0)


@dataclass(frozen=True, kw_only=True)
class RankOfTwo(SingleProcessReducer):
    """A reducer that says it is rank ``rank`` of 2 (its collectives stay the identity: no peer here)."""

    world_size: int = 2
    rank: int = 0


def test_ranks_resume_from_a_checkpoint_with_disjoint_shares_of_its_replay(tmp_path) -> None:
    first = ComaLearner(spec=SPEC, section=SECTION, device=CPU, seed=0)
    for i in range(3):
        first.update(rollout(i), update_index=i)
    saved = first.replay.state_dict()["field.rewards"]
    path = save_checkpoint(tmp_path, learned=first.state_dict(), state=TrainerState(update=3), keep=2)
    shares = []
    for rank in range(2):
        learner = ComaLearner(spec=SPEC, section=SECTION, device=CPU, seed=rank, reducer=RankOfTwo(rank=rank))
        assert learner.replay.capacity == 25 and learner.rank_batch_size == 8  # buffer_size and batch_size halved
        learner.load_state_dict(load_checkpoint(path).learned)
        shares.append(learner.replay.state_dict()["field.rewards"])
        np.testing.assert_array_equal(shares[-1], saved[rank::2][-25:])
    assert len(shares[0]) + len(shares[1]) == min(len(saved), 50)
