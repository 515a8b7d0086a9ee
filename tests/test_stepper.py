"""The actor host's inference step (GroupStepper): recurrent state resets and truncation bootstraps, rows that
replay to the actor's log-probs, inactive (finished) agents left out of the data, action masks obeyed and
recorded, and named episode statistics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from actors.assembler import RowAssembler
from envs.base import EnvSpec, StepBuffers
from envs.spaces import ActionSpace
from actors.inference import Inference
from actors.recurrent_state import AgentStates
from actors.rows_report import RowsReport
from actors.slot_layout import GroupView, SlotLayout
from actors.stepper import GroupStepper
from configs.schema import ModelSection
from protocol.rows import HOST_STATS

SPEC = EnvSpec(num_agents=1, obs_shape=(2, 3), obs_dtype="float32", action=ActionSpace.discrete(3))
LSTM = ModelSection(hidden_size=8, num_layers=2, core="lstm")


class RecordingAssembler(RowAssembler):
    """Keeps a copy of what every add_staged call records."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.calls: list[dict] = []

    def add_staged(self, staged, agent_ids, version):
        n = len(agent_ids)
        values = {name: array[:n].copy() for name, array in staged.arrays.items()}
        self.calls.append(dict(ids=agent_ids.copy(), obs=values["obs"], bootstrap=values["bootstrap"],
                               dones=values["dones"], states=values.get("states", np.zeros((n, 0), np.float32)),
                               actions=values["actions"], rewards=values["rewards"], masks=values.get("action_masks")))
        return super().add_staged(staged, agent_ids, version)


def stepper_for(spec: EnvSpec, model: ModelSection, *, workers: int, envs: int, horizon: int, seed: int):
    """A GroupStepper over ``workers`` workers of one group of ``envs`` envs each, in-process; also each group's
    buffers and the group views."""
    torch.manual_seed(seed)
    inference = Inference(spec, model, seed=seed)
    total = workers * envs * spec.num_agents
    assembler = RecordingAssembler(num_agents=total, num_rows=64 * total, horizon=horizon,
                                   obs_shape=spec.obs_shape, obs_dtype=spec.obs_dtype,
                                   state_size=inference.state_size, action_shape=spec.action.shape,
                                   action_dtype=spec.action.dtype, mask_size=spec.mask_size)
    states = AgentStates(total, inference.state_size)
    layout = SlotLayout(workers=workers, groups=1, envs_per_group=envs, agents_per_env=spec.num_agents)
    stepper = GroupStepper(env_spec=spec, layout=layout, inference=inference, assembler=assembler, states=states)
    views = layout.group_views(StepBuffers.allocate(spec, workers * envs))
    return stepper, [view.buffers for view in views], views


def act(stepper: GroupStepper, views: list[GroupView], report: RowsReport | None = None) -> RowsReport:
    report = report or RowsReport()
    stepper.act(views, report)
    return report


def fake_env_step(rng: np.random.Generator, b: StepBuffers) -> None:
    """Random obs; some episodes terminate, some are truncated (with a random final obs)."""
    n = len(b.obs)
    b.obs[:] = rng.standard_normal(b.obs.shape)
    b.terminated[:] = rng.random(n) < 0.1
    b.truncated[:] = ~b.terminated & (rng.random(n) < 0.1)
    b.final_obs[:] = rng.standard_normal(b.obs.shape) * b.truncated[:, None, None]
    b.episode_done[:] = b.terminated | b.truncated
    b.episode_return[:] = 1.0
    b.episode_length[:] = 3


@pytest.mark.parametrize("core", ["lstm", "mlp"])
def test_states_reset_bootstrap_from_pre_reset_state_and_rows_replay(core: str) -> None:
    model = ModelSection(hidden_size=8, num_layers=1, core=core)
    stepper, buffers, views = stepper_for(SPEC, model, workers=2, envs=3, horizon=5, seed=7)
    rng = np.random.default_rng(3)
    policy = stepper.inference.policy
    truncations = 0
    for _ in range(40):
        for b in buffers:
            fake_env_step(rng, b)
        before = stepper.states.array.copy()
        act(stepper, views)
        call = stepper.assembler.calls[-1]
        ended = call["dones"].astype(bool)
        prior = before[call["ids"]]
        np.testing.assert_array_equal(call["states"], np.where(ended[:, None], 0.0, prior))
        truncated = np.concatenate([b.truncated for b in buffers])
        if truncated.any():  # V(final obs) from the state before the reset
            final_obs = np.concatenate([b.final_obs for b in buffers])[truncated]
            with torch.no_grad():
                want = policy.step(torch.from_numpy(final_obs), torch.from_numpy(prior[truncated]))[1]
            np.testing.assert_allclose(call["bootstrap"][truncated], want.numpy(), rtol=1e-6, atol=1e-6)
            if core == "lstm":
                assert np.abs(prior[truncated]).sum() > 0  # the state it used was a live one
            truncations += int(truncated.sum())
        assert (call["bootstrap"][~truncated] == 0).all()
    assert truncations > 0
    # The learner replays each row from its stored state and gets the actor's log-probs and values back.
    rows = stepper.assembler.pop_full(1000)
    g = stepper.assembler.gather(rows)
    assert len(rows) > 20 and g["states"].shape == (len(rows), policy.state_size)
    with torch.no_grad():
        params, values = policy.forward_rows(torch.from_numpy(g["obs"]), torch.from_numpy(g["dones"]).float(),
                                             torch.from_numpy(g["states"]))
    logp = torch.log_softmax(params, -1).gather(-1, torch.from_numpy(g["actions"]).long()[..., None])[..., 0]
    np.testing.assert_allclose(logp.numpy(), g["logprobs"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(values.numpy(), g["values"], rtol=1e-5, atol=1e-5)


def test_forgotten_worker_states_are_zeroed_and_partial_rows_dropped() -> None:
    stepper, buffers, views = stepper_for(SPEC, LSTM, workers=2, envs=2, horizon=4, seed=1)
    for b in buffers:
        b.obs[:] = 1.0
    act(stepper, views)
    assert (np.abs(stepper.states.array).sum(axis=1) > 0).all()
    stepper.forget_worker(1)
    assert (np.abs(stepper.states.array[:2]).sum(axis=1) > 0).all()
    assert (stepper.states.array[2:] == 0).all()
    assert list(stepper.assembler.ep_lengths) == [1, 1, 0, 0]


def test_inactive_slots_are_neither_acted_for_nor_recorded() -> None:
    """Agents 1 and 2 of a 3-agent env finished early: only agent 0's steps reach the rows, until they return."""
    spec = EnvSpec(num_agents=3, obs_shape=(2,), obs_dtype="float32", action=ActionSpace.discrete(4))
    stepper, (buf,), views = stepper_for(spec, ModelSection(hidden_size=8, num_layers=1), workers=1, envs=1, horizon=3,
                                  seed=0)
    buf.obs[:] = np.arange(6, dtype=np.float32).reshape(3, 2)
    report = act(stepper, views)
    buf.active[:] = [True, False, False]
    buf.actions[:] = 7  # whatever was there: inactive slots must come back with action 0
    buf.episode_done[:] = [False, True, True]  # their episodes ended on the step they finished
    buf.episode_return[:] = [0.0, 2.5, -1.0]
    buf.episode_length[:] = [0, 4, 4]
    for _ in range(3):
        act(stepper, views, report)
        buf.episode_done[:] = False
    calls = stepper.assembler.calls
    assert [list(c["ids"]) for c in calls] == [[0, 1, 2], [0], [0], [0]]
    assert list(buf.actions[1:]) == [0, 0]
    assert report.agent_steps == 3 + 3 and report.env_steps == 4
    assert report.returns == [2.5, -1.0] and report.lengths == [4, 4]
    # the host's inference counters: one forward pass per act, of the active agents only
    stats = report.host_stats()
    assert tuple(stats) == HOST_STATS
    assert stats["inference_batches"] == 4 and stats["inference_agents"] == 6
    assert 0 < stats["inference_s"] <= stats["act_s"]
    # back at the env's reset: the held reward and the episode end arrive with the first obs of the new episode
    buf.active[:] = True
    buf.rewards[:] = [0.0, 5.0, -5.0]
    buf.terminated[:] = [True, True, True]
    act(stepper, views, report)
    assert list(calls[-1]["ids"]) == [0, 1, 2] and list(calls[-1]["rewards"]) == [0.0, 5.0, -5.0]
    # agent 1's row holds exactly its two real steps so far: no padding for the steps it sat out
    assert list(stepper.assembler.ep_lengths) == [1, 2, 2]  # agent 0 filled two rows of 3 (one step shared)
    full = stepper.assembler.gather(stepper.assembler.pop_full(10))
    assert full["obs"].shape[0] == 2 and (full["obs"][:, :, 0] == 0).all()  # agent 0's rows only


def test_action_masks_are_obeyed_and_recorded() -> None:
    spec = EnvSpec(num_agents=2, obs_shape=(3,), obs_dtype="float32", action=ActionSpace.multi_discrete([3, 2]),
                   action_mask=True)
    stepper, (buf,), views = stepper_for(spec, ModelSection(hidden_size=8, num_layers=1), workers=1, envs=8, horizon=2,
                                  seed=2)
    rng = np.random.default_rng(0)
    counts = np.zeros((16, 3), dtype=np.int64)
    for _ in range(50):
        buf.obs[:] = rng.standard_normal(buf.obs.shape)
        mask = np.zeros((16, 5), dtype=np.uint8)
        mask[:, 0:3] = rng.random((16, 3)) < 0.5
        mask[np.arange(16), rng.integers(0, 3, 16)] = 1  # at least one legal choice for component 0
        mask[:, 4] = 1  # component 1: only choice 1 is legal
        buf.action_mask[:] = mask
        act(stepper, views)
        assert mask[np.arange(16), buf.actions[:, 0]].all(), "an illegal first component was sampled"
        assert (buf.actions[:, 1] == 1).all()
        np.testing.assert_array_equal(stepper.assembler.calls[-1]["masks"], mask)
        counts[np.arange(16), buf.actions[:, 0]] += 1
    assert counts.sum() == 800
    rows = stepper.assembler.gather(stepper.assembler.pop_full(1000))
    assert rows["action_masks"].shape[1:] == (2, 5) and rows["actions"].shape[1:] == (2, 2)
    # the recorded log-prob is that of the masked distribution: replaying with the mask gives it back
    policy = stepper.inference.policy
    with torch.no_grad():
        params, _ = policy.forward_rows(torch.from_numpy(rows["obs"]), torch.zeros(rows["obs"].shape[:2]),
                                        torch.zeros(len(rows["obs"]), 0))
        logp = policy.distribution.log_prob(params, torch.from_numpy(rows["action_masks"]),
                                            torch.from_numpy(rows["actions"]))
    np.testing.assert_allclose(logp.numpy(), rows["logprobs"], rtol=1e-5, atol=1e-5)


def test_named_episode_stats_are_collected() -> None:
    spec = EnvSpec(num_agents=1, obs_shape=(1,), obs_dtype="float32", action=ActionSpace.discrete(2),
                   episode_stats=("collected", "converted"))
    stepper, (buf,), views = stepper_for(spec, ModelSection(hidden_size=4, num_layers=1), workers=1, envs=3, horizon=3,
                                  seed=0)
    buf.episode_done[:] = [True, False, True]
    buf.episode_stats[:] = [[1.0, 2.0], [9.0, 9.0], [3.0, 4.0]]
    report = act(stepper, views)
    assert report.stats == {"collected": [1.0, 3.0], "converted": [2.0, 4.0]}
    report.clear()
    assert report.stats == {"collected": [], "converted": []} and report.agent_steps == 0
