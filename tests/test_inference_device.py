"""``actors.inference.Inference`` on a device: the same policy on the CPU and on a GPU gives the same values and
log-probs (the GPU test runs only where torch sees CUDA; ops/bench/gpu_check.sh runs it on a GPU machine)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from actors.inference import Inference
from configs.schema import ModelSection
from envs.base import EnvSpec
from envs.spaces import ActionSpace
from policies.factory import state_arrays

SPEC = EnvSpec(num_agents=1, obs_shape=(2, 6, 7), obs_dtype="uint8", action=ActionSpace.discrete(7),
               action_mask=True, image_layout="chw")


def _batch(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    obs = (rng.random((n, *SPEC.obs_shape)) < 0.3).astype(np.uint8) * 255
    masks = (rng.random((n, 7)) < 0.7).astype(np.uint8)
    masks[:, 0] = 1
    return obs, masks


def _pair(device: str, core: str) -> tuple[Inference, Inference]:
    model = ModelSection(hidden_size=32, num_layers=1, core=core)
    cpu = Inference(SPEC, model, seed=3)
    other = Inference(SPEC, model, seed=3, device=device)
    other.load(1, state_arrays(cpu.policy))
    return cpu, other


def _check_same_decisions(cpu: Inference, other: Inference) -> None:
    obs, masks = _batch(64, seed=5)
    states = np.random.default_rng(6).standard_normal((64, cpu.state_size)).astype(np.float32)
    decided = other.decide(obs, states, masks)
    assert decided.actions.dtype == np.int32 and decided.actions.shape == (64,)
    assert masks[np.arange(64), decided.actions].all(), "an illegal action was sampled"
    np.testing.assert_allclose(decided.values, cpu.values(obs, states), rtol=1e-4, atol=1e-5)
    # the log-prob of each sampled action, as the CPU policy computes it
    with torch.no_grad():
        params, _, new_states = cpu.policy.step(torch.from_numpy(obs), torch.from_numpy(states))
        logprobs = cpu.policy.distribution.log_prob(params, torch.from_numpy(masks),
                                                    torch.from_numpy(decided.actions))
    np.testing.assert_allclose(decided.logprobs, logprobs.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(decided.states, new_states.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("core", ["mlp", "lstm"])
def test_an_explicit_cpu_device_decides_as_the_cpu_policy(core):
    _check_same_decisions(*_pair("cpu", core))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("core", ["mlp", "lstm"])
def test_a_cuda_policy_decides_as_the_cpu_policy(core):
    cpu, gpu = _pair("cuda", core)
    assert next(gpu.policy.parameters()).device.type == "cuda"
    _check_same_decisions(cpu, gpu)
