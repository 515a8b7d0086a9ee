"""Batched policy inference on an actor host: sample actions, log-probs, values (and truncation values).

Feed-forward and recurrent policies share one path: every policy's ``step(obs, state)`` takes and returns
a per-agent state of ``policy.state_size`` floats (zero width for the MLP). ``actors.null_policy.NullInference`` is
the benchmark's null policy: the same interface, uniformly random legal actions, no network.

``Inference(..., device="cuda")`` (``python -m actors --device cuda``) keeps the policy on the GPU: each batch's
observations, states and masks go over as one copy each, the actions are sampled there (a CUDA generator, seeded
like the CPU one) and come back as NumPy arrays, so the stepper sees no difference. Batching is unchanged: one
forward pass per inference step, over every ready env group.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from envs.base import EnvSpec
from configs.schema import ModelSection
from actors.small_mlp import SmallMLP
from policies.factory import load_state_arrays, make_policy


@dataclass(frozen=True, kw_only=True)
class Decisions:
    """What the policy decided for a batch of agents."""

    actions: np.ndarray
    """[n, *action_shape] sampled actions (int32 for the discrete kinds, float32 for box)."""
    logprobs: np.ndarray
    """[n] float32 behaviour log-probs of those actions."""
    values: np.ndarray
    """[n] float32 value estimates of the observations."""
    states: np.ndarray
    """[n, state_size] float32 recurrent state after this step (the input of the agent's next step)."""


class HostPolicy:
    """A policy module on an actor host (in eval mode), the version of its weights, and a seeded sampler."""

    def __init__(self, policy: nn.Module, *, seed: int, device: str = "cpu") -> None:
        self.device = torch.device(device)
        self.policy = policy.to(self.device)
        self.policy.eval()
        self.version = 0
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)

    def load(self, version: int, arrays: dict[str, np.ndarray]) -> None:
        """Switch to the given weights."""
        load_state_arrays(self.policy, arrays)
        self.version = version


class Inference(HostPolicy):
    """The current per-agent policy (``policies.factory.make_policy``), its version, and a seeded sampler.

    A small MLP policy on the CPU (feed-forward or with an LSTM cell) runs as its NumPy twin
    (``actors.small_mlp.SmallMLP``, rebuilt at each ``load``): the same function and draw, without torch's cost per
    operation."""

    def __init__(self, spec: EnvSpec, model: ModelSection, *, seed: int, device: str = "cpu") -> None:
        super().__init__(make_policy(spec, model), seed=seed, device=device)
        self.state_size: int = self.policy.state_size
        self.action_shape = spec.action.shape
        self.seed = seed
        self.small: SmallMLP | None = SmallMLP.of(self.policy, seed=seed)
        """The policy's NumPy twin, or None (another kind of policy, or not on the CPU: torch runs it)."""

    def load(self, version: int, arrays: dict[str, np.ndarray]) -> None:
        """Switch to the given weights (the NumPy twin reads them too; its draws go on in the same stream)."""
        super().load(version, arrays)
        if self.small is not None:
            self.small = SmallMLP.of(self.policy, seed=self.seed, stream=self.small.stream)

    def decide(self, obs: np.ndarray, states: np.ndarray, masks: np.ndarray | None = None) -> Decisions:
        """Sample one action per observation, from each agent's state ``states`` [n, state_size], under
        ``masks`` [n, mask_size] (None or width 0: no masks)."""
        if self.small is None:
            return self._decide_torch(obs, states, masks)
        n = len(obs)
        params, values, new_states = self.small.step(obs, self._checked(states, n))
        actions, logprobs = self.small.draw(params, masks)
        return Decisions(actions=actions.reshape((n, *self.action_shape)), logprobs=logprobs, values=values,
                         states=new_states)

    @torch.no_grad()
    def _decide_torch(self, obs: np.ndarray, states: np.ndarray, masks: np.ndarray | None) -> Decisions:
        """``decide`` by the torch module."""
        params, values, new_states = self.policy.step(self._tensor(obs), self._states(states, len(obs)))
        mask = self._tensor(masks) if masks is not None and masks.shape[-1] else None
        actions, logprobs = self.policy.distribution.sample(params, mask, self.generator)
        return Decisions(actions=_numpy(actions), logprobs=_numpy(logprobs.to(torch.float32)),
                         values=_numpy(values), states=_numpy(new_states))

    @torch.no_grad()
    def values(self, obs: np.ndarray, states: np.ndarray) -> np.ndarray:
        """Value estimates only (for the final observations of truncated episodes, from their last state)."""
        if self.small is not None:
            return self.small.step(obs, self._checked(states, len(obs)))[1]
        return _numpy(self.policy.step(self._tensor(obs), self._states(states, len(obs)))[1])

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        """``array`` as a tensor on the policy's device (a view on the CPU, one copy to a GPU)."""
        return torch.from_numpy(array).to(self.device)

    def _checked(self, states: np.ndarray, n: int) -> np.ndarray:
        """[n, state_size] states, checked, as float32 (a view when they are already)."""
        if states.shape != (n, self.state_size):
            raise ValueError(f"states shape {states.shape} != {(n, self.state_size)}")
        return np.ascontiguousarray(states, dtype=np.float32)

    def _states(self, states: np.ndarray, n: int) -> torch.Tensor:
        """Checked float32 tensor view of [n, state_size] states."""
        return self._tensor(self._checked(states, n))


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    """A CPU NumPy array of ``tensor`` (no copy when it is on the CPU already)."""
    return tensor.cpu().numpy()
