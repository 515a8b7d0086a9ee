"""The actor host's inference step as it was before the compiled batch pass (``StepBatch``): per-group Python that
concatenates each field of the ready groups' own buffers. Kept as the reference the hot path is checked against
(tests/test_stepper_reference.py): from the same seeds, both must write the same actions and the same rows, bit for
bit."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from actors.rows_report import RowsReport
from actors.slot_layout import GroupView
from actors.stepper import GroupStepper


class ReferenceStepper(GroupStepper):
    """GroupStepper whose ``act`` reads and writes each group's own buffers (``GroupView.buffers``) in Python."""

    def act(self, groups: Sequence[GroupView], report: RowsReport) -> None:
        started = time.perf_counter()
        spg = self.layout.slots_per_group
        all_ids = np.concatenate([view.slot_ids for view in groups])
        learner = None if self.opponents is None else self.opponents.learner_slots[all_ids]
        self._group_episode_stats(groups, report, learner)
        active = np.concatenate([view.buffers.active for view in groups])
        theirs = None
        if learner is not None:
            theirs = np.flatnonzero(active & ~learner)
            active = active & learner
        chosen = None if active.all() else np.flatnonzero(active)
        joined: dict[str, np.ndarray] = {}

        def gather(name: str, where: np.ndarray | None = chosen) -> np.ndarray:
            if name not in joined:
                joined[name] = np.concatenate([getattr(view.buffers, name) for view in groups])
            return joined[name] if where is None else joined[name][where]

        agent_ids = all_ids if chosen is None else all_ids[chosen]
        obs, rewards = gather("obs"), gather("rewards")
        terminated, truncated = gather("terminated"), gather("truncated")
        masks = gather("action_mask") if self.env_spec.mask_size else None
        bootstrap = np.zeros(len(obs), dtype=np.float32)
        if truncated.any():
            final_obs = gather("final_obs")[truncated]
            bootstrap[truncated] = self.inference.values(final_obs, self.states.read(agent_ids[truncated]))
        self.states.reset(agent_ids[terminated | truncated])
        state_in = self.states.read(agent_ids)
        decisions = self.inference.decide(obs, state_in, masks)
        report.inference_batches += 1
        report.inference_agents += len(agent_ids)
        self.states.write(agent_ids, decisions.states)
        actions = decisions.actions
        if chosen is not None:
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
        report.act_s += time.perf_counter() - started

    def _group_episode_stats(self, groups: Sequence[GroupView], report: RowsReport,
                             learner: np.ndarray | None) -> None:
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
