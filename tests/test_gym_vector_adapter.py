"""GymnasiumVectorAdapter: autoreset modes mapped onto held rewards / inactive slots, time limits, errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from envs.base import StepBuffers
from envs.adapters.gym_vector_adapter import GymnasiumVectorAdapter

MODES = ("NextStep", "SameStep", "Disabled")
FAKE = "tests.fake_envs:sync_vector"


def _fake(num_envs: int, mode: str = "NextStep", max_steps: int = 0, env: str = "EchoEnv",
          per_env: list | None = None, **env_kwargs: Any) -> GymnasiumVectorAdapter:
    kwargs = {"autoreset_mode": mode, "env": env, "env_kwargs": env_kwargs, "per_env": per_env}
    return GymnasiumVectorAdapter(FAKE, num_envs, max_steps=max_steps, kwargs=kwargs)


def _step(env: GymnasiumVectorAdapter, buf: StepBuffers, actions: list) -> dict[str, list]:
    buf.actions[:] = actions
    env.step(buf)
    return {name: getattr(buf, name).tolist() for name in
            ("obs", "rewards", "terminated", "truncated", "active", "episode_done")}


def test_next_step_holds_the_last_reward_on_an_inactive_slot() -> None:
    # EchoEnv: obs [episode, t, seed]; reward 10 t + env action; Discrete(3, start=-1); terminates at t == 2
    env = _fake(2, "NextStep", length=2)
    assert env.spec.obs_shape == (3,) and env.spec.num_actions == 3
    buf = StepBuffers.allocate(env.spec, 2)
    env.reset(buf, seed=7)
    assert buf.obs.tolist() == [[0, 0, 7], [0, 0, 8]] and buf.active.all()  # sub-env i seeded 7 + i
    got = _step(env, buf, [2, 0])
    assert got["rewards"] == [11, 9] and got["obs"] == [[0, 1, 7], [0, 1, 8]] and got["active"] == [True, True]
    got = _step(env, buf, [0, 1])  # both episodes end: reported now, reward and flag held, slots sit out
    assert got["active"] == [False, False] and got["episode_done"] == [True, True]
    assert got["rewards"] == [0, 0] and got["terminated"] == [False, False]
    assert buf.episode_return.tolist() == [30, 29] and buf.episode_length.tolist() == [2, 2]
    got = _step(env, buf, [99, -5])  # inactive slots: their actions are neither checked nor used
    assert got["active"] == [True, True] and got["obs"] == [[1, 0, 7], [1, 0, 8]]
    assert got["rewards"] == [19, 20] and got["terminated"] == [True, True] and got["episode_done"] == [False, False]
    got = _step(env, buf, [1, 1])
    assert got["rewards"] == [10, 10] and got["terminated"] == [False, False]
    assert [int(a) for a in env._env.envs[0].received] == [1, -1, 0]  # start -1 added; no action at the reset
    env.close()


@pytest.mark.parametrize("mode", MODES)
def test_env_truncation_and_adapter_time_limit(mode: str) -> None:
    # sub-env 0 truncates itself at t == 2; the adapter's max_steps=3 cuts sub-env 1 (length 10)
    env = _fake(2, mode, max_steps=3, length=10, per_env=[{"truncate_at": 2}, {}])
    buf = StepBuffers.allocate(env.spec, 2)
    env.reset(buf, seed=0)
    _step(env, buf, [1, 1])
    got = _step(env, buf, [1, 1])
    assert got["episode_done"] == [True, False] and buf.episode_length[0] == 2 and buf.episode_return[0] == 30
    if mode == "NextStep":
        assert got["active"] == [False, True] and not got["truncated"][0]
        got = _step(env, buf, [1, 1])  # slot 0 resets (held truncation); slot 1 hits the adapter's limit
        assert got["truncated"] == [True, True] and got["rewards"] == [20, 30]
        assert buf.final_obs.tolist() == [[0, 2, 0], [0, 3, 1]] and got["obs"] == [[1, 0, 0], [1, 0, 1]]
        assert got["episode_done"] == [False, True]
    else:
        assert got["truncated"] == [True, False] and buf.final_obs[0].tolist() == [0, 2, 0]
        assert got["obs"][0] == [1, 0, 0] and got["rewards"] == [20, 20]
        got = _step(env, buf, [1, 1])
        assert got["truncated"] == [False, True] and buf.final_obs[1].tolist() == [0, 3, 1]
        assert got["obs"] == [[1, 1, 0], [1, 0, 1]] and got["episode_done"] == [False, True]
    assert buf.episode_length[1] == 3 and buf.episode_return[1] == 60 and buf.active.all()


def _record(mode: str, max_steps: int, steps: int, **make_kwargs: Any) -> tuple[list, list]:
    """Per slot: every active step's (obs, reward, terminated, truncated, final obs), and every episode end."""
    n = 3
    env = GymnasiumVectorAdapter("gymnasium:make_vec", n, max_steps=max_steps, kwargs={
        "id": "CartPole-v1", "vectorization_mode": "sync", "vector_kwargs": {"autoreset_mode": mode},
        **make_kwargs})
    buf = StepBuffers.allocate(env.spec, n)
    table = np.random.default_rng(0).integers(0, 2, size=(n, steps + 1))
    env.reset(buf, seed=3)
    records: list[list] = [[(buf.obs[i].tolist(),)] for i in range(n)]
    episodes: list[list] = [[] for _ in range(n)]
    for _ in range(steps):
        for i in range(n):  # each slot's k-th action is table[i, k], whichever the mode
            buf.actions[i] = table[i, len(records[i]) - 1] if buf.active[i] else 7
        env.step(buf)
        for i in range(n):
            if buf.episode_done[i]:
                episodes[i].append((float(buf.episode_return[i]), int(buf.episode_length[i])))
            if buf.active[i]:
                final = buf.final_obs[i].tolist() if buf.truncated[i] else None
                records[i].append((buf.obs[i].tolist(), float(buf.rewards[i]), bool(buf.terminated[i]),
                                   bool(buf.truncated[i]), final))
    env.close()
    return [r[:steps - 10] for r in records], [e[:3] for e in episodes]


@pytest.mark.parametrize(("max_steps", "make_kwargs"), [(0, {"max_episode_steps": 12}), (9, {})])
def test_autoreset_modes_give_identical_active_steps(max_steps: int, make_kwargs: dict) -> None:
    reference = _record("SameStep", max_steps, 60, **make_kwargs)
    records, episodes = reference
    assert all(len(e) == 3 for e in episodes)  # every slot finished a few episodes
    assert any(rec[2] for slot in records for rec in slot[1:])  # some terminated
    assert any(rec[3] for slot in records for rec in slot[1:])  # some truncated (env's limit or the adapter's)
    for mode in ("NextStep", "Disabled"):
        assert _record(mode, max_steps, 60, **make_kwargs) == reference, mode


@pytest.mark.parametrize(
    ("kind", "actions", "received"),
    [
        ("multi_discrete", [[0, 0], [2, 1]], [[1, -1], [3, 0]]),
        ("box", [[-7.0, 0.5], [0.25, 9.0]], [[-1.0, 0.5], [0.25, 2.0]]),
    ],
)
def test_actions_converted(kind: str, actions: list, received: list) -> None:
    env = _fake(2, kind=kind)
    assert env.spec.action.kind == kind
    buf = StepBuffers.allocate(env.spec, 2)
    env.reset(buf, seed=0)
    buf.actions[:] = np.asarray(actions, dtype=buf.actions.dtype)
    env.step(buf)
    for i in range(2):
        np.testing.assert_array_equal(env._env.envs[i].received[-1], received[i])
    np.testing.assert_allclose(buf.rewards, [10 + np.sum(r) for r in received])


@pytest.mark.parametrize("mode", MODES)
def test_masks_reach_buffers(mode: str) -> None:
    from tests.fake_envs import mask_at

    env = _fake(2, mode, kind="masked", length=2)
    assert env.spec.action_mask and env.spec.mask_size == 4
    buf = StepBuffers.allocate(env.spec, 2)
    env.reset(buf, seed=0)
    for _ in range(7):
        for i in range(2):
            assert buf.action_mask[i].tolist() == mask_at(int(buf.obs[i, 1]), 0).tolist() or not buf.active[i]
        buf.actions[:] = [np.flatnonzero(m)[0] for m in buf.action_mask]  # legal (the env raises otherwise)
        env.step(buf)


def test_wrong_things_from_the_entry_point() -> None:
    with pytest.raises(ValueError, match=r"^gymnasium_vector env 'tests.fake_envs:not_a_vector_env': the entry "
                                         r"point returned a tests.fake_envs.EchoEnv, not a gymnasium.vector.VectorEnv"):
        GymnasiumVectorAdapter("tests.fake_envs:not_a_vector_env", 2, max_steps=0, kwargs={})
    with pytest.raises(ValueError, match=r"'tests.fake_envs:wrong_size_vector': the entry point was asked for "
                                         r"num_envs=2 but returned a VectorEnv with num_envs=3"):
        GymnasiumVectorAdapter("tests.fake_envs:wrong_size_vector", 2, max_steps=0, kwargs={})
    with pytest.raises(RuntimeError, match=r"'tests.fake_envs:raising_factory' raised in make\(\): "
                                           r"OSError\('licence server unreachable'\)"):
        GymnasiumVectorAdapter("tests.fake_envs:raising_factory", 2, max_steps=0, kwargs={})
    with pytest.raises(ValueError, match=r"env.entry_point 'nope' \(env 'gymnasium_vector'\) must look like"):
        GymnasiumVectorAdapter("nope", 2, max_steps=0, kwargs={})


def test_unsupported_space() -> None:
    with pytest.raises(ValueError, match=r"^gymnasium_vector env 'tests.fake_envs:sync_vector': action space is "
                                         r"Text\(.*; supported:"):
        GymnasiumVectorAdapter(FAKE, 1, max_steps=0, kwargs={"env": "UnsupportedEnv",
                                                              "env_kwargs": {"what": "text_action"}})


def test_time_limit_needs_masked_reset() -> None:
    # make_vec's own CartPoleVectorEnv (NEXT_STEP) cannot reset single sub-envs
    with pytest.raises(ValueError, match=r"^gymnasium_vector env 'gymnasium:make_vec' \(id 'CartPole-v1'\): "
                                         r"env.max_steps=100 \(the adapter's time limit\) needs .*reset_mask.*"
                                         r"CartPoleVectorEnv in mode NEXT_STEP; set env.max_steps: 0"):
        GymnasiumVectorAdapter("gymnasium:make_vec", 2, max_steps=100, kwargs={"id": "CartPole-v1"})
    env = GymnasiumVectorAdapter("gymnasium:make_vec", 2, max_steps=0, kwargs={"id": "CartPole-v1"})
    assert env.spec.obs_shape == (4,) and env.spec.num_actions == 2
    env.close()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_env_errors_name_env_and_call() -> None:
    env = _fake(2, env="RaisingEnv", where="step", after=1)
    buf = StepBuffers.allocate(env.spec, 2)
    env.reset(buf, seed=0)
    env.step(buf)
    with pytest.raises(RuntimeError, match=r"^gymnasium_vector env 'tests.fake_envs:sync_vector' raised in step\(\): "
                                           r"ZeroDivisionError\('physics blew up'\)"):
        env.step(buf)
    env = _fake(2, env="RaisingEnv", where="reset")
    with pytest.raises(RuntimeError, match=r"raised in reset\(\): OSError\('simulator crashed in reset'\)"):
        env.reset(StepBuffers.allocate(env.spec, 2), seed=0)
    for when in ("reset", "step"):
        env = GymnasiumVectorAdapter("tests.fake_envs:bad_obs_vector", 2, max_steps=0, kwargs={"when": when})
        buf = StepBuffers.allocate(env.spec, 2)
        with pytest.raises(ValueError, match=rf"^gymnasium_vector env 'tests.fake_envs:bad_obs_vector' \(all 2 envs\) "
                                             rf"{when}\(\) returned observations with shape \(2, 3, 5, 5\) dtype "
                                             r"float32; expected shape \(2, 3, 5, 5\) dtype uint8 \(from its "
                                             r"single_observation_space\)"):
            env.reset(buf, seed=0)
            env.step(buf)


def test_action_out_of_range_names_env() -> None:
    env = _fake(3)
    buf = StepBuffers.allocate(env.spec, 3)
    env.reset(buf, seed=0)
    buf.actions[:] = [0, 1, 3]
    with pytest.raises(ValueError, match=r"'tests.fake_envs:sync_vector' \(env 2\): action 3 is out of range \[0, 3\)"):
        env.step(buf)


def test_make_vec_cartpole_through_the_registry() -> None:
    from envs.registry import env_spec, make_vec_env
    from configs.env_config import EnvConfig

    # make_vec's own CartPoleVectorEnv: NEXT_STEP, its own 500-step limit kept (max_steps 0)
    cfg = EnvConfig(name="gymnasium_vector", entry_point="gymnasium:make_vec", kwargs={"id": "CartPole-v1"},
                    max_steps=0)
    env = make_vec_env(cfg, 4)
    assert isinstance(env, GymnasiumVectorAdapter) and env.spec == env_spec(cfg)
    buf = StepBuffers.allocate(env.spec, 4)
    env.reset(buf, seed=1)
    sitting_out = np.zeros(4, dtype=bool)
    episodes = 0
    for _ in range(120):
        buf.actions[:] = np.where(buf.active, 1, 5)  # always push right: short episodes
        env.step(buf)
        # a slot that sat out comes back with its held termination and reward 1; others never carry a flag
        assert (buf.active[sitting_out]).all() and (buf.terminated == sitting_out).all()
        assert (buf.rewards[buf.active] == 1).all() and (buf.rewards[~buf.active] == 0).all()
        assert (buf.episode_return[buf.episode_done] == buf.episode_length[buf.episode_done]).all()
        assert (~buf.active == buf.episode_done).all()  # reported on the step it ends, slot inactive
        episodes += int(buf.episode_done.sum())
        sitting_out = ~buf.active
    assert episodes >= 4 * 120 // 15
    env.close()
