"""PPO as an ``Algorithm``: seeds/000's update (learner/ppo/update.py) with its optimizer, schedules, the KL-penalty
reference policy and its refresh (seeds/003), and value warm-up.

Checkpoint files: the policy as ``model``, the optimizer as ``optimizer`` and, when kl_divergence_coef_rho > 0,
the reference policy as ``reference`` (learner/run/checkpoint.py writes ``<name>.safetensors`` for each); with
norm_value_targets the return statistics as ``value_normalizer``, with entropy_floor the entropy coefficient's
multiplier as ``entropy_control``.
"""

from __future__ import annotations

import copy
import dataclasses

import torch
from torch import nn

from configs.plan import BatchPlan
from configs.schema import ModelSection, TrainerSection
from envs.base import EnvSpec
from learner.update.algorithm import Algorithm
from learner.update.batch import RowBatch
from learner.run.checkpoint import LearnedState
from learner.ppo.entropy_control import EntropyControl
from learner.update.input_health import batch_frozen_fraction
from learner.ppo.losses import minibatch_losses
from learner.update.optimizer_step import fused_supported
from learner.ppo.update import ppo_update
from learner.update.reducer import SINGLE_PROCESS, Reducer
from learner.ppo.schedules import schedule_for
from learner.ppo.value_normalization import RunningMeanStd
from policies.factory import make_policy
from policies.obs_normalization import update_obs_normalizer


def make_optimizer(policy: nn.Module, trainer: TrainerSection) -> torch.optim.Optimizer:
    """Adam or AdamW (seeds/003) with the configured epsilon and weight decay; fused where the policy's device has
    fused kernels, so a non-finite gradient's step is skipped without a host sync (learner/update/optimizer_step.py)."""
    kind = torch.optim.AdamW if trainer.optimizer == "adamw" else torch.optim.Adam
    return kind(policy.parameters(), lr=trainer.learning_rate, eps=trainer.adam_eps,
                weight_decay=trainer.weight_decay, fused=fused_supported(policy.parameters()))


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
                 device: torch.device, minibatch_seed: int, reducer: Reducer = SINGLE_PROCESS) -> None:
        """``minibatch_seed`` seeds the minibatch sampler (the learner passes run.seed + the update it starts at,
        so a resumed run does not replay the first run's draws); ``reducer``: a data-parallel learner rank's
        collectives (``plan`` is then the rank's share, configs/rank_plan.py)."""
        self.trainer = trainer
        self.reducer = reducer
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
        self.value_normalizer = RunningMeanStd().to(device) if trainer.norm_value_targets else None
        self.entropy_control = (EntropyControl(trainer.entropy_floor) if trainer.entropy_floor is not None
                                else None)

    def update(self, batch: RowBatch, *, update_index: int) -> dict[str, float]:
        """One PPO update under the schedules of update ``update_index`` (value warm-up among them), then the
        reference refresh when one is due and, with entropy_floor, the entropy coefficient's adaptation."""
        schedule = schedule_for(self.trainer, update_index, self.plan.total_epochs)
        scheduled_ent_coef = schedule.ent_coef
        if self.entropy_control is not None:
            schedule = dataclasses.replace(schedule, ent_coef=self.entropy_control.coefficient(scheduled_ent_coef))
        gather = self.reducer.gather if self.reducer.world_size > 1 else None
        update_obs_normalizer(self.policy, batch.obs[:, :-1], gather)  # model.obs_norm: what the forward passes read
        metrics = ppo_update(self.policy, self.optimizer, batch, trainer=self.trainer, plan=self.plan,
                             schedule=schedule, generator=self.generator, reference=self.reference,
                             loss_fn=self.loss_fn, value_normalizer=self.value_normalizer, reducer=self.reducer,
                             autocast=self.trainer.autocast)
        self._refresh_reference(updates_done=update_index + 1)
        frozen = batch_frozen_fraction(self.policy, batch.obs, batch.dones, batch.states)
        if frozen is not None:  # input health (learner/update/input_health.py): how much of the first layer is stuck
            metrics["first_layer_frozen_frac"] = frozen
        if self.entropy_control is not None:
            metrics["ent_coef_scheduled"] = scheduled_ent_coef
            metrics["ent_coef_multiplier"] = float(self.entropy_control.multiplier)
            if not schedule.vf_warmup:
                self.entropy_control.adapt(metrics["entropy"])
        return metrics

    def _refresh_reference(self, *, updates_done: int) -> None:
        """enable_ref_update (seeds/003): every ref_update_interval updates the reference becomes the policy."""
        if (self.reference is not None and self.trainer.enable_ref_update
                and updates_done % self.trainer.ref_update_interval == 0):
            self.reference.load_state_dict(self.policy.state_dict())

    def state_dict(self) -> LearnedState:
        """The policy, the optimizer and, when there are, the reference policy, the return statistics and the
        entropy coefficient's multiplier."""
        modules = {"model": self.policy.state_dict()}
        for name, module in self._extra_modules().items():
            modules[name] = module.state_dict()
        return LearnedState(modules=modules, optimizers={"optimizer": self.optimizer.state_dict()})

    def load_state_dict(self, state: LearnedState) -> None:
        """Weights and optimizer state from a checkpoint, and the reference policy, return statistics and entropy
        multiplier where they were saved (where not, each stays as made at construction: the reference a copy of the
        initial policy, the statistics empty, the multiplier 1)."""
        self.policy.load_state_dict(state.modules["model"])
        self.optimizer.load_state_dict(state.optimizers["optimizer"])
        for name, module in self._extra_modules().items():
            if name in state.modules:
                module.load_state_dict(state.modules[name])

    def _extra_modules(self) -> dict[str, nn.Module]:
        """The checkpointed modules besides the policy, by file name: those this run's options use."""
        named = {"reference": self.reference, "value_normalizer": self.value_normalizer,
                 "entropy_control": self.entropy_control}
        return {name: module for name, module in named.items() if module is not None}
