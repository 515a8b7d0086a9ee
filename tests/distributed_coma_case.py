"""The COMA case of tests/test_distributed_update.py: gradient steps on a fixed minibatch of joint transitions, which
K ranks split evenly. The target actions are made deterministic (the squashed mean, ``deterministic_sampling``) so
that the single process and the ranks draw no noise: what is left to compare is the gradient averaging itself."""

from __future__ import annotations

from contextlib import contextmanager
from collections.abc import Iterator

import numpy as np
import torch

from configs.schema import ComaSection
from learner.coma.algorithm import Coma, transition_fields
from learner.update.reducer import SINGLE_PROCESS, Reducer
from policies import tanh_gaussian
from policies.team_actors import ComaShapes

SHAPES = ComaShapes(num_agents=2, obs_dim=3, state_dim=5, action_low=(0.0, -1.0), action_high=(1.0, 1.0),
                    noop_action=(0.0, 0.0))
SECTION = ComaSection(hidden_sizes=[16, 16], batch_size=8, actor_lr=1e-2, critic_lr=1e-2, tau=0.1,
                      max_grad_norm=0.5, entropy_coef=0.01, default_action="zero", max_importance_weight=2.0)
TRANSITIONS = 8
STEPS = 3


def make_coma_case(seed: int) -> dict[str, torch.Tensor]:
    """TRANSITIONS random joint transitions, every field of ``transition_fields``."""
    rng = np.random.default_rng(seed)
    case = {}
    for name, (shape, dtype) in transition_fields(SHAPES).items():
        values = rng.normal(size=(TRANSITIONS, *shape))
        if name == "actions":
            values = rng.uniform(0.05, 0.95, size=(TRANSITIONS, *shape))
        elif name == "logprobs":
            values = rng.uniform(-3.0, 0.0, size=(TRANSITIONS, *shape))
        elif name == "terminated":
            values = (rng.random(TRANSITIONS) < 0.3)
        case[name] = torch.from_numpy(values.astype(dtype))
    return case


@contextmanager
def deterministic_sampling() -> Iterator[None]:
    """tanh_gaussian.sample returns the squashed mean (log-prob 0) while inside."""
    original = tanh_gaussian.sample

    def mean_action(mean, log_std, low, high, generator=None):
        return mean, tanh_gaussian.mode(mean, low, high), torch.zeros(mean.shape[:-1])

    tanh_gaussian.sample = mean_action
    try:
        yield
    finally:
        tanh_gaussian.sample = original


def run_coma_steps(case: dict[str, torch.Tensor], *, rank: int, world_size: int,
                   reducer: Reducer = SINGLE_PROCESS) -> tuple[Coma, list[dict[str, float]]]:
    """STEPS train_steps of rank ``rank``'s contiguous share of the case; the networks and each step's metrics."""
    coma = Coma(SHAPES, SECTION, seed=0, device=torch.device("cpu"))
    share = TRANSITIONS // world_size
    minibatch = {name: values[rank * share:(rank + 1) * share] for name, values in case.items()}
    with deterministic_sampling():
        metrics = [coma.train_step(minibatch, reducer) for _ in range(STEPS)]
    return coma, metrics
