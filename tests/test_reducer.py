"""The single-process reducer is the identity, and sampling probabilities with a reducer are the global ones."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from learner.ppo.update import sampling_probs
from learner.update.reducer import SINGLE_PROCESS


@dataclass(frozen=True, kw_only=True)
class TwoRanksSum:
    """One of two ranks whose peer's contribution to every ``sum`` is known in advance (``peer_sum``)."""

    world_size: int = 2
    """Two ranks."""
    peer_sum: torch.Tensor
    """What the other rank contributes to the one sum ``sampling_probs`` takes."""

    def sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's tensor plus the peer's."""
        return tensor + self.peer_sum


def test_single_process_reducer_is_the_identity():
    tensor = torch.randn(3, 4)
    assert SINGLE_PROCESS.world_size == 1
    for method in (SINGLE_PROCESS.sum, SINGLE_PROCESS.average, SINGLE_PROCESS.gather):
        assert method(tensor) is tensor
    layer = nn.Linear(2, 2)
    layer(torch.randn(5, 2)).sum().backward()
    before = [p.grad.clone() for p in layer.parameters()]
    SINGLE_PROCESS.average_gradients(layer.parameters())
    assert all(torch.equal(p.grad, b) for p, b in zip(layer.parameters(), before))


@settings(max_examples=40, deadline=None)
@given(half=st.integers(1, 6), horizon=st.integers(1, 5), alpha=st.sampled_from([0.0, 0.4, 1.0]),
       seed=st.integers(0, 2**16), zero_half=st.booleans())
def test_rank_probabilities_are_the_whole_batch_ones(half, horizon, alpha, seed, zero_half):
    rng = np.random.default_rng(seed)
    advantages = rng.normal(size=(2 * half, horizon)).astype(np.float32)
    if zero_half:
        advantages[:half] = 0.0  # one rank's rows all 0: its probabilities still use the peer's priorities
    weights = np.abs(advantages.astype(np.float64)).sum(1) ** alpha
    expected = (np.full(2 * half, 1 / (2 * half)) if alpha == 0.0
                else (weights + 1e-6) / (weights.sum() + 1e-6))
    for rank in range(2):
        mine = slice(rank * half, (rank + 1) * half)
        peer = slice((1 - rank) * half, (2 - rank) * half)
        peer_sum = torch.tensor(weights[peer].sum(), dtype=torch.float32)
        got = sampling_probs(torch.from_numpy(advantages[mine]), alpha, TwoRanksSum(peer_sum=peer_sum))
        np.testing.assert_allclose(got.numpy(), expected[mine], rtol=1e-5, atol=1e-7)
