"""Team rows -> COMA's joint transitions (``learner.coma.algorithm.transition_fields``).

A team row holds ``T + 1`` consecutive steps of one env (``protocol.rows``), so it gives ``T`` transitions: step t's
global state, observations, pre-tanh draws, env actions (their squash), behaviour log-probs, then what arrived with
step t + 1: the rewards, and the next state and observations. Where the episode ended on the way into step t + 1
(``dones``), step t + 1 already belongs to the next episode: the next state and observations are the row's
``final_global_state`` / ``final_obs`` there, and the transition is terminal unless it was a truncation
(``truncated``), which bootstraps like any other step. Consecutive rows of an env share one step (the last of a
row is the first of the next), so together they give each transition once.
"""

from __future__ import annotations

import numpy as np
import torch

from learner.update.batch import RowBatch
from policies import tanh_gaussian


def transitions_from_rows(batch: RowBatch, low: torch.Tensor, high: torch.Tensor) -> dict[str, np.ndarray]:
    """Every transition of a batch of team rows, [S * T, ...] float32 per field, row by row."""
    rows, horizon, agents = batch.obs.shape[:3]
    obs = batch.obs.to(torch.float32).reshape(rows, horizon, agents, -1)
    final_obs = batch.final_obs.to(torch.float32).reshape(rows, horizon, agents, -1)
    ended = batch.dones[:, 1:] > 0  # [S, T]: the episode ended on the transition out of step t
    truncated = batch.truncated[:, 1:] > 0
    next_obs = torch.where(ended[..., None, None], final_obs[:, 1:], obs[:, 1:])
    next_state = torch.where(ended[..., None], batch.final_global_state[:, 1:], batch.global_state[:, 1:])
    pre_tanh = batch.actions[:, :-1].to(torch.float32)
    joint = {"state": batch.global_state[:, :-1], "obs": obs[:, :-1], "pre_tanh": pre_tanh,
             "actions": tanh_gaussian.squash(pre_tanh, low, high), "logprobs": batch.logprobs[:, :-1],
             "rewards": batch.rewards[:, 1:], "next_state": next_state, "next_obs": next_obs,
             "terminated": (ended & ~truncated).to(torch.float32)}
    count = rows * (horizon - 1)
    return {name: np.ascontiguousarray(value.reshape(count, *value.shape[2:]).detach().cpu().numpy(),
                                       dtype=np.float32)
            for name, value in joint.items()}
