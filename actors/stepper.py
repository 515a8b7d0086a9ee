"""One inference step of an actor host: ready env groups in shared memory -> actions back, steps recorded.

``GroupStepper.act`` reads what the workers of the ready groups wrote into their ``StepBuffers``
(observations, rewards, episode ends, action masks, which slots are active), runs the policy once for all
active agents, writes the actions into the groups' buffers and records the steps in the row assembler.
Inactive slots (agents that finished before the rest of their env, sub-envs between an episode end and
their reset) are neither acted for nor recorded: the learner never sees a padded step. The host only wakes
the workers afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from actors.assembler import RowAssembler
from actors.host_metrics import HostMetrics
from actors.inference import Inference, NullInference
from actors.opponents import Opponents
from actors.recurrent_state import AgentStates
from actors.rows_report import RowsReport
from actors.slot_layout import GroupView, SlotLayout
from envs.base import EnvSpec


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

    @property
    def steps_per_group(self) -> int:
        """Steps one group adds to the assembler at most: one per agent slot."""
        return self.layout.slots_per_group

    def act(self, groups: Sequence[GroupView], report: RowsReport) -> None:
        """For each ready group: decide for its active agents, write their actions, record the steps."""
        started = time.perf_counter()
        spg = self.layout.slots_per_group
        all_ids = np.concatenate([view.slot_ids for view in groups])
        learner = None if self.opponents is None else self.opponents.learner_slots[all_ids]
        self._episode_stats(groups, report, learner)
        active = np.concatenate([view.buffers.active for view in groups])
        theirs = None
        if learner is not None:  # opponent seats act through their snapshots and are never recorded
            theirs = np.flatnonzero(active & ~learner)
            active = active & learner
        chosen = None if active.all() else np.flatnonzero(active)

        joined: dict[str, np.ndarray] = {}

        def gather(name: str, where: np.ndarray | None = chosen) -> np.ndarray:
            if name not in joined:  # one concatenation per field, shared by the learner's and opponents' seats
                joined[name] = np.concatenate([getattr(view.buffers, name) for view in groups])
            return joined[name] if where is None else joined[name][where]

        agent_ids = all_ids if chosen is None else all_ids[chosen]
        obs, rewards = gather("obs"), gather("rewards")
        terminated, truncated = gather("terminated"), gather("truncated")
        masks = gather("action_mask") if self.env_spec.mask_size else None
        bootstrap = np.zeros(len(obs), dtype=np.float32)
        if truncated.any():  # V(final obs) from the state the agent had before its episode ended
            final_obs = gather("final_obs")[truncated]
            bootstrap[truncated] = self.inference.values(final_obs, self.states.read(agent_ids[truncated]))
        self.states.reset(agent_ids[terminated | truncated])  # obs is the first of a new episode there
        state_in = self.states.read(agent_ids)
        decide_started = time.perf_counter()
        decisions = self.inference.decide(obs, state_in, masks)
        forward_s = time.perf_counter() - decide_started
        report.inference_s += forward_s
        report.inference_batches += 1
        report.inference_agents += len(agent_ids)
        self.states.write(agent_ids, decisions.states)
        actions = decisions.actions
        if chosen is not None:  # inactive slots get a zero action, which their env ignores
            action = self.env_spec.action
            actions = np.zeros((len(active), *action.shape), dtype=action.dtype)
            actions[chosen] = decisions.actions
        if theirs is not None and len(theirs):
            their_masks = gather("action_mask", theirs) if self.env_spec.mask_size else None
            actions[theirs] = self.opponents.act(all_ids[theirs], gather("obs", theirs), their_masks)
        for i, view in enumerate(groups):
            view.buffers.actions[:] = actions[i * spg:(i + 1) * spg]
        env_steps = len(groups) * self.layout.envs_per_group
        report.env_steps += env_steps
        self.env_steps += env_steps
        report.agent_steps += len(agent_ids)
        if len(agent_ids):
            dones = (terminated | truncated).astype(np.uint8)
            self.assembler.add_steps(agent_ids, obs, decisions.actions, decisions.logprobs, decisions.values,
                                     rewards, dones, bootstrap, self.inference.version, states=state_in,
                                     action_masks=masks)
        step_s = time.perf_counter() - started
        report.act_s += step_s
        if self.metrics is not None:
            self.metrics.step_timed(step_s=step_s, forward_s=forward_s, agents=len(agent_ids))

    def forget_worker(self, worker: int) -> None:
        """A worker died and is being replaced: drop its agents' partial rows and zero their states."""
        agents = self.layout.worker_slots(worker)
        self.assembler.discard_agents(agents)
        self.states.reset(agents)  # the new worker's envs start fresh episodes

    def _episode_stats(self, groups: Sequence[GroupView], report: RowsReport, learner: np.ndarray | None) -> None:
        """Collect the episodes that ended in these groups, whether or not their slots act now (in self-play:
        the learner's seats only; an env whose episode ended switches to its next opponent, if one waits)."""
        spg = self.layout.slots_per_group
        for i, view in enumerate(groups):
            b = view.buffers
            done = b.episode_done
            if learner is not None:
                if done.any():
                    self.opponents.episodes_ended(view.slot_ids[done])
                done = done & learner[i * spg:(i + 1) * spg]
            if done.any():
                report.returns.extend(b.episode_return[done].tolist())
                report.lengths.extend(b.episode_length[done].tolist())
                for k, name in enumerate(self.env_spec.episode_stats):
                    report.stats.setdefault(name, []).extend(b.episode_stats[done, k].tolist())
