"""The inference step's compiled batch pass (``GroupStepper.act`` over ``StepBatch``) against the per-group Python it
replaced (tests/reference_stepper.py): from the same seeds and the same env outputs, the same actions in shared
memory, the same rows, ring state and recurrent states, and the same report, bit for bit, over random batches of
groups with inactive slots, terminations, truncations, action masks, episode statistics and self-play seats; the
new one wakes the workers before it records, and workers that overwrite their slots at once change nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from actors.assembler import RowAssembler
from actors.inference import Inference
from actors.null_policy import NullInference
from actors.opponents import learner_seats
from actors.recurrent_state import AgentStates
from actors.rows_report import RowsReport
from actors.slot_layout import SlotLayout
from actors.step_batch import StepBatch
from actors.stepper import GroupStepper
from configs.schema import ModelSection
from envs.base import EnvSpec, StepBuffers
from envs.spaces import ActionSpace
from tests.reference_stepper import ReferenceStepper

AGENTS = 2
SPEC = EnvSpec(num_agents=AGENTS, obs_shape=(3, 2), obs_dtype="float32", action=ActionSpace.multi_discrete([3, 2]),
               action_mask=True, episode_stats=("score",))
LAYOUT = SlotLayout(workers=3, groups=2, envs_per_group=4, agents_per_env=AGENTS)


class ScriptedOpponents:
    """Self-play seats: the learner sits at ``learner_seats``; the opponent takes its first legal choices."""

    def __init__(self) -> None:
        self.learner_slots = learner_seats(LAYOUT.total_envs, AGENTS)
        self.ended: list[int] = []

    def episodes_ended(self, agent_ids: np.ndarray) -> None:
        self.ended.extend(agent_ids.tolist())

    def act(self, agent_ids: np.ndarray, obs: np.ndarray, masks: np.ndarray | None) -> np.ndarray:
        first = np.stack([masks[:, :3].argmax(axis=1), masks[:, 3:].argmax(axis=1)], axis=1)
        return (first + (obs[:, 0, :1] > 0)).astype(np.int32) % [3, 2]


def build(stepper_type: type[GroupStepper], policy: str, selfplay: bool) -> GroupStepper:
    torch.manual_seed(11)
    inference = (NullInference(SPEC, seed=5) if policy == "null"
                 else Inference(SPEC, ModelSection(hidden_size=8, num_layers=1, core=policy), seed=5))
    total = LAYOUT.total_slots
    assembler = RowAssembler(num_agents=total, num_rows=4 * total, horizon=5, obs_shape=SPEC.obs_shape,
                             obs_dtype=SPEC.obs_dtype, state_size=inference.state_size,
                             action_shape=SPEC.action.shape, action_dtype=SPEC.action.dtype, mask_size=SPEC.mask_size)
    return stepper_type(env_spec=SPEC, layout=LAYOUT, inference=inference, assembler=assembler,
                        states=AgentStates(total, inference.state_size),
                        opponents=ScriptedOpponents() if selfplay else None)


def env_step(rng: np.random.Generator, slots: StepBuffers, groups: list[int]) -> None:
    """What the workers of ``groups`` might write: random obs, rewards, episode ends, masks, inactive slots."""
    for index in groups:
        view = LAYOUT.group_views(slots)[index]
        b, n = view.buffers, LAYOUT.slots_per_group
        b.obs[:] = rng.standard_normal(b.obs.shape)
        b.rewards[:] = rng.standard_normal(n)
        b.terminated[:] = rng.random(n) < 0.15
        b.truncated[:] = ~b.terminated & (rng.random(n) < 0.15)
        b.final_obs[:] = rng.standard_normal(b.obs.shape) * b.truncated[:, None, None]
        b.episode_done[:] = rng.random(n) < 0.2
        b.episode_return[:] = rng.standard_normal(n)
        b.episode_length[:] = rng.integers(1, 50, n)
        b.episode_stats[:] = rng.standard_normal((n, 1))
        b.active[:] = rng.random(n) < (0.7 if rng.random() < 0.5 else 1.0)
        mask = (rng.random((n, 5)) < 0.6).astype(np.uint8)
        mask[np.arange(n), rng.integers(0, 3, n)] = 1
        mask[np.arange(n), 3 + rng.integers(0, 2, n)] = 1
        b.action_mask[:] = mask


@pytest.mark.parametrize("policy,selfplay", [("null", False), ("lstm", False), ("mlp", True), ("null", True)])
def test_compiled_batch_pass_matches_the_per_group_reference_bit_for_bit(policy: str, selfplay: bool) -> None:
    steppers = [build(GroupStepper, policy, selfplay), build(ReferenceStepper, policy, selfplay)]
    slots = [StepBuffers.allocate(SPEC, LAYOUT.total_envs) for _ in steppers]
    views = [LAYOUT.group_views(s) for s in slots]
    reports = [RowsReport.for_stats(SPEC.episode_stats) for _ in steppers]
    order = np.random.default_rng(1)
    envs = [np.random.default_rng(2) for _ in steppers]  # the same env outputs on both sides
    messages = 0
    scribble = np.random.default_rng(3)
    woken: list[np.ndarray] = []

    def wake_and_step_at_once(groups: list) -> None:
        """The woken workers overwrite their slots while the stepper records: it must have copied what it needs."""
        for view in groups:
            woken.append(view.buffers.actions.copy())
            for name in ("obs", "rewards", "final_obs", "episode_return", "episode_stats"):
                array = getattr(view.buffers, name)
                array[:] = scribble.standard_normal(array.shape)
            for name in ("terminated", "truncated", "episode_done", "active", "action_mask"):
                array = getattr(view.buffers, name)
                array[:] = scribble.random(array.shape) < 0.5

    for _ in range(120):
        groups = order.choice(len(views[0]), size=order.integers(1, LAYOUT.workers + 1), replace=False).tolist()
        for stepper, side_slots, side_views, report, rng in zip(steppers, slots, views, reports, envs):
            env_step(rng, side_slots, groups)
            stepper.act([side_views[g] for g in groups], report,
                        **({"wake": wake_and_step_at_once} if stepper is steppers[0] else {}))
        new, old = steppers
        np.testing.assert_array_equal(np.concatenate(woken), np.concatenate([views[1][g].buffers.actions
                                                                             for g in groups]))
        woken.clear()
        np.testing.assert_array_equal(new.states.array, old.states.array)
        while new.assembler.full_rows() >= 8 or old.assembler.full_rows() >= 8:  # ship, as the host does
            shipped = [stepper.assembler.pop_full(8) for stepper in steppers]
            np.testing.assert_array_equal(*shipped)
            for name, array in new.assembler.gather(shipped[0]).items():
                np.testing.assert_array_equal(array, old.assembler.gather(shipped[1])[name], err_msg=name)
            for stepper, rows in zip(steppers, shipped):
                stepper.assembler.release(rows)
            messages += 1
    for name, array in new.assembler.arrays.items():
        np.testing.assert_array_equal(array, old.assembler.arrays[name], err_msg=name)
    for name in ("ep_indices", "ep_lengths", "free_ring", "full_ring", "rings", "row_state"):
        np.testing.assert_array_equal(getattr(new.assembler, name), getattr(old.assembler, name), err_msg=name)
    assert messages > 10  # rows really completed
    new_fields, old_fields = reports[0].fields(0), reports[1].fields(0)
    for timing in ("host_stats",):
        new_fields.pop(timing), old_fields.pop(timing)
    assert new_fields == old_fields and len(new_fields["episode_returns"]) > 50
    if selfplay:
        assert sorted(new.opponents.ended) == sorted(old.opponents.ended) and new.opponents.ended


def test_group_views_need_the_whole_hosts_slots_and_a_batch_fits_its_step_batch() -> None:
    with pytest.raises(ValueError, match="group_view takes the StepBuffers of all 48 slots of the host, got 8"):
        LAYOUT.group_view(0, 0, StepBuffers.allocate(SPEC, 4))
    views = LAYOUT.group_views(StepBuffers.allocate(SPEC, LAYOUT.total_envs))
    outputs = {"obs": np.zeros((8, *SPEC.obs_shape), dtype=np.float32),
               "action_masks": np.zeros((8, SPEC.mask_size), dtype=np.uint8)}
    with pytest.raises(ValueError, match="a batch of 16 slots exceeds this StepBatch's 8"):
        StepBatch(8, LAYOUT.slots_per_group, outputs=outputs).scan(views[:2])
    narrow = {**outputs, "obs": np.zeros((8, 3), dtype=np.float32)}
    with pytest.raises(ValueError, match=r"the slots' observations \(24 bytes\) and masks \(5\) do not match "
                                         r"this StepBatch's \(12, 5\)"):
        StepBatch(8, LAYOUT.slots_per_group, outputs=narrow).scan(views[:1])


@pytest.mark.parametrize("obs_dtype", ["uint8", "float64", "bool"])
def test_scan_copies_any_observation_dtype_and_no_masks_as_numpy_indexing_would(obs_dtype: str) -> None:
    spec = EnvSpec(num_agents=1, obs_shape=(5, 7), obs_dtype=obs_dtype, action=ActionSpace.discrete(3))
    layout = SlotLayout(workers=2, groups=2, envs_per_group=6, agents_per_env=1)
    slots = StepBuffers.allocate(spec, layout.total_envs)
    rng = np.random.default_rng(4)
    slots.obs[:] = (rng.standard_normal(slots.obs.shape) * 50).astype(obs_dtype)
    slots.rewards[:] = rng.standard_normal(layout.total_slots)
    slots.active[:] = rng.random(layout.total_slots) < 0.7
    slots.terminated[:] = rng.random(layout.total_slots) < 0.3
    capacity = layout.total_slots
    outputs = {"obs": np.full((capacity, 5, 7), 7, dtype=obs_dtype)}
    batch = StepBatch(capacity, layout.slots_per_group, outputs=outputs)
    views = layout.group_views(slots)
    scanned = batch.scan([views[3], views[0]])
    ids = np.concatenate([views[3].slot_ids, views[0].slot_ids])
    chosen = np.flatnonzero(slots.active[ids])
    np.testing.assert_array_equal(scanned.ids, ids)
    np.testing.assert_array_equal(scanned.chosen, chosen)
    np.testing.assert_array_equal(scanned.agent_ids, ids[chosen])
    np.testing.assert_array_equal(outputs["obs"][:len(chosen)], slots.obs[ids[chosen]])
    assert (outputs["obs"][len(chosen):] == np.array(7, dtype=obs_dtype)).all()  # nothing past the batch written
    np.testing.assert_array_equal(batch.rewards[:len(chosen)], slots.rewards[ids[chosen]])
    np.testing.assert_array_equal(batch.dones[:len(chosen)], slots.terminated[ids[chosen]])
    np.testing.assert_array_equal(scanned.reset, ids[chosen][slots.terminated[ids[chosen]]])
    assert batch.masks.shape == (capacity, 0) and not scanned.any_theirs
