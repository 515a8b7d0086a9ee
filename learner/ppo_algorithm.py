"""PPO as an ``Algorithm``: seeds/000's update (learner/ppo.py) with its optimizer, schedules, the KL-penalty
reference policy and its refresh (seeds/003), and value warm-up.

Checkpoint files: the policy as ``model``, the optimizer as ``optimizer`` and, when kl_divergence_coef_rho > 0,
the reference policy as ``reference`` (learner/checkpoint.py writes ``<name>.safetensors`` for each).
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from configs.plan import BatchPlan
from configs.schema import ModelSection, TrainerSection
from envs.base import EnvSpec
from learner.algorithm import Algorithm
from learner.batch import RowBatch
from learner.checkpoint import LearnedState
from learner.losses import minibatch_losses
from learner.ppo import ppo_update
from learner.schedules import schedule_for
from policies.factory import make_policy


def make_optimizer(policy: nn.Module, trainer: TrainerSection) -> torch.optim.Optimizer:
    """Adam or AdamW (seeds/003) with the configured epsilon and weight decay."""
    kind = torch.optim.AdamW if trainer.optimizer == "adamw" else torch.optim.Adam
    return kind(policy.parameters(), lr=trainer.learning_rate, eps=trainer.adam_eps,
                weight_decay=trainer.weight_decay)


def zero_value_head(policy: nn.Module) -> None:
    """zero_initial_vf (seeds/003): the value head starts at exactly 0."""
    with torch.no_grad():
        policy.critic.weight.zero_()
        policy.critic.bias.zero_()


def make_reference(policy: nn.Module) -> nn.Module:
    """A frozen copy of the policy for the KL penalty."""
    reference = copy.deepcopy(policy)
    reference.requires_grad_(False)
    return reference


class PPO(Algorithm):
    """One policy with a value head, trained by ``ppo_update`` under the schedules of ``schedule_for``."""

    def __init__(self, *, spec: EnvSpec, model: ModelSection, trainer: TrainerSection, plan: BatchPlan,
                 device: torch.device, minibatch_seed: int) -> None:
        """``minibatch_seed`` seeds the minibatch sampler (the learner passes run.seed + the update it starts at,
        so a resumed run does not replay the first run's draws)."""
        self.trainer = trainer
        self.plan = plan
        self.policy = make_policy(spec, model).to(device)
        if trainer.zero_initial_vf:
            zero_value_head(self.policy)
        self.optimizer = make_optimizer(self.policy, trainer)
        self.reference = make_reference(self.policy) if trainer.kl_divergence_coef_rho > 0 else None
        self.loss_fn = (torch.compile(minibatch_losses, mode=trainer.compile_mode) if trainer.compile
                        else minibatch_losses)
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(minibatch_seed)

    def update(self, batch: RowBatch, *, update_index: int) -> dict[str, float]:
        """One PPO update under the schedules of update ``update_index`` (value warm-up among them), then the
        reference refresh when one is due."""
        schedule = schedule_for(self.trainer, update_index, self.plan.total_epochs)
        metrics = ppo_update(self.policy, self.optimizer, batch, trainer=self.trainer, plan=self.plan,
                             schedule=schedule, generator=self.generator, reference=self.reference,
                             loss_fn=self.loss_fn)
        self._refresh_reference(updates_done=update_index + 1)
        return metrics

    def _refresh_reference(self, *, updates_done: int) -> None:
        """enable_ref_update (seeds/003): every ref_update_interval updates the reference becomes the policy."""
        if (self.reference is not None and self.trainer.enable_ref_update
                and updates_done % self.trainer.ref_update_interval == 0):
            self.reference.load_state_dict(self.policy.state_dict())

    def state_dict(self) -> LearnedState:
        """The policy, the optimizer and, when there is one, the reference policy."""
        modules = {"model": self.policy.state_dict()}
        if self.reference is not None:
            modules["reference"] = self.reference.state_dict()
        return LearnedState(modules=modules, optimizers={"optimizer": self.optimizer.state_dict()})

    def load_state_dict(self, state: LearnedState) -> None:
        """Weights and optimizer state from a checkpoint, and the reference policy where one was saved (where
        none was, the reference stays the copy of the initial policy made at construction)."""
        self.policy.load_state_dict(state.modules["model"])
        self.optimizer.load_state_dict(state.optimizers["optimizer"])
        if self.reference is not None and "reference" in state.modules:
            self.reference.load_state_dict(state.modules["reference"])
