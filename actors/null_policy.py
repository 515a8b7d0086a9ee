"""The benchmark's null policy: uniformly random legal actions, value 0, no network.

``python -m actors --null-policy`` uses it, so ``ops/bench/pipeline.py`` measures the pipeline's own cost: its
draws must cost next to nothing. Discrete kinds are drawn by one compiled pass over the batch (``_draw_discrete``:
per agent and component, count the legal choices, pick one with a uniform draw from the policy's own
SplitMix64 stream); box actions by ``ActionDistribution`` from zero params. The log-probs are this policy's true
ones, so its rows are valid (off-policy) training data.
"""

from __future__ import annotations

import math

import numba
import numpy as np
import torch

from actors.inference import Decisions
from actors.random_stream import uniform
from envs.base import EnvSpec
from policies.distributions import ActionDistribution

@numba.njit(cache=True)
def _draw_discrete(state, nvec, masks, actions, logprobs):
    """One uniformly random legal choice per agent and component into ``actions`` [n, components] and the summed
    log-prob into ``logprobs`` [n]. ``masks`` [n, sum(nvec)] (nonzero: legal), or of width 0 for no masks; a
    component with no legal choice is unmasked."""
    masked = masks.shape[1] > 0
    for r in range(actions.shape[0]):
        logprob = 0.0
        offset = 0
        for c in range(nvec.shape[0]):
            size = nvec[c]
            legal = 0
            if masked:
                for j in range(size):
                    if masks[r, offset + j] != 0:
                        legal += 1
            everything = legal == 0 or legal == size
            choices = size if everything else legal
            pick = min(int(uniform(state) * choices), choices - 1)
            if everything:
                actions[r, c] = pick
            else:
                for j in range(size):
                    if masks[r, offset + j] != 0:
                        if pick == 0:
                            actions[r, c] = j
                            break
                        pick -= 1
            logprob -= math.log(choices)
            offset += size
        logprobs[r] = logprob


class NullInference:
    """Uniformly random actions (legal ones, under masks; N(0, 1) for box), value 0, no network (module docstring)."""

    state_size = 0

    def __init__(self, spec: EnvSpec, *, seed: int) -> None:
        self.space = spec.action
        self.distribution = ActionDistribution(spec.action)
        self.version = 0
        self.stream = np.array([seed], dtype=np.uint64)
        """The state of this policy's SplitMix64 stream (the discrete draws)."""
        self.nvec = np.asarray(self.space.nvec if self.space.kind != "box" else (), dtype=np.int64)
        self.no_masks = np.zeros((0, 0), dtype=np.uint8)
        self.generator = torch.Generator()
        self.generator.manual_seed(seed)

    def load(self, version: int, arrays: dict[str, np.ndarray]) -> None:
        """Record the version; the weights are not used."""
        self.version = version

    def decide(self, obs: np.ndarray, states: np.ndarray, masks: np.ndarray | None = None) -> Decisions:
        """One uniformly random (legal) action per observation."""
        n = len(obs)
        if self.space.kind == "box":
            with torch.no_grad():
                actions, logprobs = self.distribution.sample(torch.zeros(n, self.space.param_size), None,
                                                             self.generator)
            actions, logprobs = actions.numpy(), logprobs.to(torch.float32).numpy()
        else:
            actions = np.empty((n, len(self.nvec)), dtype=np.int32)
            logprobs = np.empty(n, dtype=np.float32)
            has_masks = masks is not None and masks.shape[-1]
            _draw_discrete(self.stream, self.nvec, masks if has_masks else self.no_masks, actions, logprobs)
        return Decisions(actions=actions.reshape((n, *self.space.shape)), logprobs=logprobs,
                         values=np.zeros(n, dtype=np.float32), states=np.zeros((n, 0), dtype=np.float32))

    def values(self, obs: np.ndarray, states: np.ndarray) -> np.ndarray:
        """Zero for every observation."""
        return np.zeros(len(obs), dtype=np.float32)
