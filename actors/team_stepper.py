"""One inference step of an actor host for COMA: team rows, one row per env with every agent's step together.

``TeamStepper.act`` reads the ready groups like ``GroupStepper`` does, but decides for whole envs: every agent of an
env by its own actor (``TeamInference``), and records one step per env in the assembler (whose row writers are the
host's envs, ids ``slot // agents_per_env``): all agents' observations, pre-tanh actions, log-probabilities and
rewards, the env's episode end and whether it was a truncation, its global state, and where an episode ended its
final observations and state (``protocol.rows``, team rows). COMA needs every agent of an env on every step: a slot
that is not active stops the host with a message saying so.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from actors.assembler import RowAssembler
from actors.host_metrics import HostMetrics
from actors.recurrent_state import AgentStates
from actors.rows_report import RowsReport
from actors.slot_layout import GroupView, SlotLayout
from actors.stepper import GroupStepper
from actors.team_inference import TeamInference
from envs.base import EnvSpec


class TeamStepper(GroupStepper):
    """Inference and recording of team rows for ready env groups (row writer id = host-wide env id)."""

    def __init__(self, *, env_spec: EnvSpec, layout: SlotLayout, inference: TeamInference, assembler: RowAssembler,
                 metrics: HostMetrics | None = None) -> None:
        super().__init__(env_spec=env_spec, layout=layout, inference=inference, assembler=assembler,
                         states=AgentStates(layout.total_envs, 0), metrics=metrics)
        self.team = inference

    def _stage_inputs(self) -> None:
        """None: team rows go through ``RowAssembler.add`` (one step per env, of the env's agents together)."""

    @property
    def steps_per_group(self) -> int:
        """Steps one group adds to the assembler: one per env."""
        return self.layout.envs_per_group

    def act(self, groups: Sequence[GroupView], report: RowsReport,
            wake: Callable[[Sequence[GroupView]], None] | None = None) -> None:
        """For each ready group: decide for every agent of every env, write the actions, ``wake`` the groups'
        workers, record one step per env (from the copies made before the wake)."""
        started = time.perf_counter()
        slots = groups[0].slots  # the host's StepBuffers: every field read and written by slot id
        ids = groups[0].slot_ids if len(groups) == 1 else np.concatenate([view.slot_ids for view in groups])
        self._episode_stats(ids[slots.episode_done[ids]], slots, report)
        n = self.layout.agents_per_env
        active = slots.active[ids]
        if not active.all():
            raise RuntimeError(f"trainer.algorithm coma needs every agent of an env to act on every step; "
                               f"{int((~active).sum())} of {len(active)} agent slots were inactive (an env whose "
                               f"agents finish at different times is not one COMA can learn from)")
        firsts = ids[::n]  # each env's first slot: where its env-wide values are
        env_ids = firsts // n
        envs = len(env_ids)
        obs = slots.obs[ids].reshape(envs, n, *self.env_spec.obs_shape)
        terminated = slots.terminated[ids].reshape(envs, n).any(axis=1)
        truncated = slots.truncated[ids].reshape(envs, n).any(axis=1) & ~terminated
        ended = terminated | truncated
        final_obs = slots.final_obs[ids].reshape(envs, n, *self.env_spec.obs_shape)
        final_state = slots.final_global_state[firsts]
        final_obs[~ended] = 0  # only an ended episode's are real; the rest are zeros, not stale values
        final_state[~ended] = 0
        decide_started = time.perf_counter()
        decisions = self.team.decide(obs)
        forward_s = time.perf_counter() - decide_started
        slots.actions[ids] = decisions.actions.reshape(envs * n, *self.env_spec.action.shape)
        global_state, rewards = slots.global_state[firsts], slots.rewards[ids].reshape(envs, n)
        if wake is not None:
            wake(groups)
        self.assembler.add(env_ids, self.team.version, obs=obs, actions=decisions.pre_tanh,
                           logprobs=decisions.logprobs, values=np.zeros(envs, np.float32),
                           rewards=rewards, dones=ended.astype(np.uint8),
                           bootstrap=np.zeros(envs, np.float32), global_state=global_state,
                           truncated=truncated.astype(np.uint8), final_obs=final_obs, final_global_state=final_state)
        report.inference_s += forward_s
        report.inference_batches += 1
        report.inference_agents += envs * n
        report.env_steps += envs
        self.env_steps += envs
        report.agent_steps += envs * n
        step_s = time.perf_counter() - started
        report.act_s += step_s
        if self.metrics is not None:
            self.metrics.step_timed(step_s=step_s, forward_s=forward_s, agents=envs * n)

    def forget_worker(self, worker: int) -> None:
        """A worker died and is being replaced: drop the partial rows of its envs."""
        first = worker * self.layout.envs_per_worker
        self.assembler.discard_agents(np.arange(first, first + self.layout.envs_per_worker, dtype=np.int64))
