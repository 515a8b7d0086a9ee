"""actors.opponent_batch.SnapshotBatch: several snapshots' forward passes as one (vmap over stacked weights) give
each snapshot's own logits for its own rows, for every encoder self-play uses, and legal sampled actions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from actors.opponent_batch import SnapshotBatch
from configs.schema import ModelSection
from envs.builtin.connect_four.game import ConnectFourVec
from policies.factory import make_policy

SPEC = ConnectFourVec.SPEC


def snapshots(model: ModelSection, count: int) -> list[torch.nn.Module]:
    policies = []
    for k in range(count):
        torch.manual_seed(k)
        policy = make_policy(SPEC, model).eval()
        for buffer in policy.buffers():  # obs_norm statistics differ per snapshot too
            buffer.copy_(torch.rand_like(buffer.float()).to(buffer.dtype) + (buffer.dtype.is_floating_point))
        policies.append(policy)
    return policies


def random_obs(rng: np.random.Generator, n: int) -> np.ndarray:
    return (rng.random((n, *SPEC.obs_shape)) < 0.3).astype(np.uint8) * 255


@pytest.mark.parametrize("model", [ModelSection(hidden_size=32, encoder="cnn"),
                                   ModelSection(hidden_size=32, encoder="cnn", obs_norm=True),
                                   ModelSection(hidden_size=16, num_layers=1, encoder="mlp")],
                         ids=["cnn", "cnn-obs-norm", "mlp"])
def test_batched_logits_equal_separate_forward_passes(model):
    rng = np.random.default_rng(0)
    policies = snapshots(model, 5)
    groups = [random_obs(rng, n) for n in (1, 7, 3, 12, 2)]  # unequal groups: padding must not leak
    batch = SnapshotBatch(policies[0].distribution, seed=0)
    in_use = {f"d{k}": policy for k, policy in enumerate(policies)}
    got = batch.logits(in_use, list(in_use), groups)
    with torch.no_grad():
        want = [policy(torch.from_numpy(obs))[0] for policy, obs in zip(policies, groups)]
    for g, w in zip(got, want):
        assert g.shape == w.shape and torch.allclose(g, w, atol=1e-5)
    # a step that needs some of the snapshots in use takes them from the stack, in its own order, without
    # stacking again; another set in use is stacked again
    stacked = batch.weights
    got = batch.logits(in_use, ["d3", "d1"], groups[:2])
    assert batch.weights is stacked
    with torch.no_grad():
        assert torch.allclose(got[0], policies[3](torch.from_numpy(groups[0]))[0], atol=1e-5)
        assert torch.allclose(got[1], policies[1](torch.from_numpy(groups[1]))[0], atol=1e-5)
    fewer = {"d4": policies[4], "d2": policies[2]}
    got = batch.logits(fewer, ["d2"], groups[2:3])
    assert batch.weights is not stacked and batch.key == ("d4", "d2")
    with torch.no_grad():
        assert torch.allclose(got[0], policies[2](torch.from_numpy(groups[2]))[0], atol=1e-5)


def test_batched_actions_are_legal_and_follow_each_snapshots_policy():
    rng = np.random.default_rng(1)
    policies = snapshots(ModelSection(hidden_size=32, encoder="cnn"), 3)
    with torch.no_grad():  # snapshot k strongly prefers column k
        for k, policy in enumerate(policies):
            policy.actor.linear.weight.zero_()
            policy.actor.linear.bias.copy_(torch.where(torch.arange(7) == k, 20.0, 0.0))
    groups = [random_obs(rng, 40) for _ in range(3)]
    masks = [np.ones((40, 7), dtype=np.uint8) for _ in range(3)]
    masks[2][:, 2] = 0  # snapshot 2's favourite is illegal: it must pick something else
    in_use = dict(zip("abc", policies))
    actions = SnapshotBatch(policies[0].distribution, seed=0).act(in_use, ["a", "b", "c"], groups, masks)
    assert [a.shape for a in actions] == [(40,)] * 3
    assert (actions[0] == 0).all() and (actions[1] == 1).all()
    assert not (actions[2] == 2).any() and set(actions[2].tolist()) <= {0, 1, 3, 4, 5, 6}
