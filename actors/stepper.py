"""One inference step of an actor host: ready env groups in shared memory -> actions back, steps recorded.

``GroupStepper.act`` reads what the workers of the ready groups wrote into their ``StepBuffers``
(observations, rewards, episode ends, action masks, which slots are active), runs the policy once for all
active agents, writes the actions into the groups' buffers, wakes their workers and records the steps in the row
assembler while the workers step (everything it records was copied out of shared memory before the wake).
Inactive slots (agents that finished before the rest of their env, sub-envs between an episode end and
their reset) are neither acted for nor recorded: the learner never sees a padded step. The host only wakes
the workers afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from actors.assembler import RowAssembler
from actors.host_metrics import HostMetrics
from actors.inference import Inference
from actors.null_policy import NullInference
from actors.opponents import Opponents
from actors.recurrent_state import AgentStates
from actors.rows_report import RowsReport
from actors.slot_layout import GroupView, SlotLayout
from actors.step_batch import StepBatch
from envs.base import EnvSpec, StepBuffers


class GroupStepper:
    """Inference and recording for ready env groups; agent id = host-wide slot id (``SlotLayout``)."""

    def __init__(self, *, env_spec: EnvSpec, layout: SlotLayout, inference: Inference | NullInference,
                 assembler: RowAssembler, states: AgentStates, opponents: Opponents | None = None,
                 metrics: HostMetrics | None = None) -> None:
        self.env_spec = env_spec
        self.layout = layout
        self.inference = inference
        self.assembler = assembler
        self.states = states
        self.opponents = opponents
        self.metrics = metrics
        """Where each step's timing goes (None: nowhere)."""
        self.env_steps = 0
        """Env steps taken since the start (all groups)."""
        self._stage_inputs()

    def _stage_inputs(self) -> None:
        """The assembler's reused inputs and the batch's arrays, which each step fills in place (checked once)."""
        env_spec, opponents = self.env_spec, self.opponents
        self.staged = self.assembler.stage(self.layout.total_slots)
        """The assembler's reused inputs, which each step fills in place (checked once, here)."""
        self.batch = StepBatch(self.layout.total_slots, self.layout.slots_per_group,
                               None if opponents is None else opponents.learner_slots, outputs=self.staged.arrays)
        """The reused arrays of one inference step's batch (any of the host's groups, each at most once)."""
        self._obs = self.staged.arrays["obs"]
        self._masks = self.staged.arrays.get("action_masks")
        self._states = self.staged.arrays.get("states")
        if self._obs.dtype != np.dtype(env_spec.obs_dtype) or (self._masks is None) != (not env_spec.mask_size):
            raise ValueError(f"the assembler's rows (obs {self._obs.dtype}, masks {self._masks is not None}) do not "
                             f"match the env (obs {env_spec.obs_dtype}, masks {bool(env_spec.mask_size)})")

    @property
    def steps_per_group(self) -> int:
        """Steps one group adds to the assembler at most: one per agent slot."""
        return self.layout.slots_per_group

    def act(self, groups: Sequence[GroupView], report: RowsReport,
            wake: Callable[[Sequence[GroupView]], None] | None = None) -> None:
        """For each ready group: decide for its active agents, write their actions, then ``wake`` the groups'
        workers, then record the steps (from copies: the workers step meanwhile).

        The groups' slots are read and written by slot id in the host's StepBuffers (``GroupView.slots``): one
        compiled pass sorts them and copies what the policy and the assembler read (``StepBatch.scan``)."""
        started = time.perf_counter()
        slots = groups[0].slots
        batch = self.batch.scan(groups)
        ids, agent_ids = batch.ids, batch.agent_ids
        if batch.any_ended:
            self._episode_stats(batch.ended, slots, report)
        n = len(agent_ids)
        obs = self._obs[:n]
        masks = None if self._masks is None else self._masks[:n]
        bootstrap = self.batch.bootstrap[:n]
        bootstrap.fill(0.0)
        if batch.any_truncated:  # V(final obs) from the state the agent had before its episode ended
            truncated_ids = agent_ids[batch.truncated_at]
            bootstrap[batch.truncated_at] = self.inference.values(slots.final_obs[truncated_ids],
                                                                  self.states.read(truncated_ids))
        if batch.any_reset:
            self.states.reset(batch.reset)  # obs is the first of a new episode there
        state_in = self.states.read(agent_ids, out=None if self._states is None else self._states[:n])
        decide_started = time.perf_counter()
        decisions = self.inference.decide(obs, state_in, masks)
        forward_s = time.perf_counter() - decide_started
        report.inference_s += forward_s
        report.inference_batches += 1
        report.inference_agents += n
        self.states.write(agent_ids, decisions.states)
        if batch.all_chosen:
            slots.actions[ids] = decisions.actions
        else:  # inactive slots get a zero action, which their env ignores
            slots.actions[ids] = 0
            slots.actions[agent_ids] = decisions.actions
            if batch.any_theirs:  # opponent seats act through their snapshots and are never recorded
                their_ids = ids[batch.theirs]
                their_masks = slots.action_mask[their_ids] if self.env_spec.mask_size else None
                slots.actions[their_ids] = self.opponents.act(their_ids, slots.obs[their_ids], their_masks)
        if wake is not None:
            wake(groups)
        env_steps = len(groups) * self.layout.envs_per_group
        report.env_steps += env_steps
        self.env_steps += env_steps
        report.agent_steps += n
        if n:
            staged = self.staged.arrays
            staged["actions"][:n] = decisions.actions
            staged["logprobs"][:n] = decisions.logprobs
            staged["values"][:n] = decisions.values
            self.assembler.add_staged(self.staged, agent_ids, self.inference.version)
        step_s = time.perf_counter() - started
        report.act_s += step_s
        if self.metrics is not None:
            self.metrics.step_timed(step_s=step_s, forward_s=forward_s, agents=n)

    def forget_worker(self, worker: int) -> None:
        """A worker died and is being replaced: drop its agents' partial rows and zero their states."""
        agents = self.layout.worker_slots(worker)
        self.assembler.discard_agents(agents)
        self.states.reset(agents)  # the new worker's envs start fresh episodes

    def _episode_stats(self, ended: np.ndarray, slots: StepBuffers, report: RowsReport) -> None:
        """Collect the episodes that ended in slots ``ended``, whether or not those act now (in self-play: the
        learner's seats only; an env whose episode ended switches to its next opponent, if one waits)."""
        if self.opponents is not None:
            self.opponents.episodes_ended(ended)
            ended = ended[self.opponents.learner_slots[ended]]
        if not len(ended):
            return
        report.returns.extend(slots.episode_return[ended].tolist())
        report.lengths.extend(slots.episode_length[ended].tolist())
        stats = slots.episode_stats[ended]
        for k, name in enumerate(self.env_spec.episode_stats):
            report.stats.setdefault(name, []).extend(stats[:, k].tolist())
