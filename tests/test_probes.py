"""The learner probe envs against expectations written out here step by step, and their registry errors."""

from __future__ import annotations

import numpy as np
import pytest

from envs.base import StepBuffers
from envs.builtin.probes import MemoryProbeVec, TruncationProbeVec
from envs.registry import env_spec, make_vec_env
from configs.env_config import EnvConfig
from configs.loader import load_config
from configs.plan import make_plan
from tests.processes import REPO

NUM_ENVS = 6


def _views(spec, num_envs: int, *, offset: int = 1) -> tuple[StepBuffers, StepBuffers]:
    """Buffers that are slices of larger arrays (like a worker's group of a shared segment), plus the whole.

    The env must write through the views in place: the ``offset`` slots before and after stay untouched.
    """
    whole = StepBuffers.allocate(spec, num_envs + 2 * offset)
    for name in ("obs", "final_obs", "rewards", "episode_return"):
        getattr(whole, name)[:] = 7
    part = slice(offset, offset + num_envs)
    return StepBuffers(**{name: getattr(whole, name)[part] for name in StepBuffers.__dataclass_fields__}), whole


def _assert_margins_untouched(whole: StepBuffers, num_envs: int, offset: int = 1) -> None:
    for name in ("obs", "final_obs", "rewards", "episode_return"):
        array = getattr(whole, name)
        assert (array[:offset] == 7).all() and (array[offset + num_envs:] == 7).all(), name


# --- probe_truncation ---------------------------------------------------------------------------------------


def test_truncation_spec() -> None:
    env = TruncationProbeVec(NUM_ENVS, max_steps=5)
    assert env.spec.num_agents == 1
    assert env.spec.obs_shape == (4,)
    assert env.spec.obs_dtype == "float32"
    assert env.spec.num_actions == 2
    assert env.num_envs == NUM_ENVS


def test_truncation_reset_writes_zero_obs_and_clears_outputs() -> None:
    env = TruncationProbeVec(NUM_ENVS, max_steps=5)
    buf, whole = _views(env.spec, NUM_ENVS)
    for name in StepBuffers.__dataclass_fields__:
        if name != "actions":
            getattr(buf, name)[:] = 1
    env.reset(buf, seed=3)
    assert (buf.obs == 0).all()
    for name in ("rewards", "terminated", "truncated", "final_obs", "episode_done", "episode_return",
                 "episode_length"):
        assert not getattr(buf, name).any(), name
    _assert_margins_untouched(whole, NUM_ENVS)


@pytest.mark.parametrize("max_steps", [1, 5, 50])
def test_truncation_reward_one_per_step_and_truncated_at_exactly_max_steps(max_steps: int) -> None:
    env = TruncationProbeVec(NUM_ENVS, max_steps=max_steps)
    buf, whole = _views(env.spec, NUM_ENVS)
    env.reset(buf, seed=0)
    rng = np.random.default_rng(1)
    for t in range(1, 3 * max_steps + 3):  # three whole episodes and a bit
        buf.actions[:] = rng.integers(0, 2, size=NUM_ENVS)  # ignored
        buf.final_obs[:] = 9.0  # must be overwritten with the last obs (zeros) on a truncation step
        env.step(buf)
        ends = t % max_steps == 0
        assert (buf.rewards == 1.0).all(), t
        assert not buf.terminated.any(), t
        assert (buf.truncated == ends).all(), t
        assert (buf.episode_done == ends).all(), t
        assert (buf.obs == 0).all(), t
        if ends:
            assert (buf.final_obs == 0).all(), t
            assert (buf.episode_return == max_steps).all(), t
            assert (buf.episode_length == max_steps).all(), t
        assert buf.rewards.dtype == np.float32 and buf.episode_length.dtype == np.int32
    _assert_margins_untouched(whole, NUM_ENVS)


def test_truncation_episode_restarts_after_reset() -> None:
    env = TruncationProbeVec(2, max_steps=4)
    buf = StepBuffers.allocate(env.spec, 2)
    env.reset(buf, seed=0)
    for _ in range(3):
        env.step(buf)
    env.reset(buf, seed=1)  # a reset mid-episode starts a whole new episode
    flags = []
    for _ in range(4):
        env.step(buf)
        flags.append(bool(buf.truncated[0]))
    assert flags == [False, False, False, True]


def test_truncation_rejects_bad_actions_and_step_before_reset() -> None:
    env = TruncationProbeVec(3, max_steps=4)
    buf = StepBuffers.allocate(env.spec, 3)
    with pytest.raises(RuntimeError, match=r"before reset"):
        env.step(buf)
    env.reset(buf, seed=0)
    buf.actions[:] = [0, 2, 1]
    with pytest.raises(ValueError, match=r"action 2 for env 1 is out of range"):
        env.step(buf)


@pytest.mark.parametrize("max_steps", [0, -1])
def test_truncation_needs_a_time_limit(max_steps: int) -> None:
    with pytest.raises(ValueError, match=r"env.max_steps for env 'probe_truncation' must be an integer >= 1"):
        TruncationProbeVec(2, max_steps=max_steps)


# --- probe_memory -------------------------------------------------------------------------------------------


def test_memory_spec() -> None:
    env = MemoryProbeVec(NUM_ENVS, delay=3)
    assert env.spec.num_agents == 1
    assert env.spec.obs_shape == (3,)
    assert env.spec.obs_dtype == "float32"
    assert env.spec.num_actions == 2
    assert env.delay == 3
    assert MemoryProbeVec(1).delay == 8


def _run_memory(env: MemoryProbeVec, buf: StepBuffers, steps: int, policy, rng: np.random.Generator) -> dict:
    """Step ``env`` while checking every output against an expectation tracked here per env.

    ``policy(cue, t, rng)`` gives the actions from the cue the test read off each env's first observation.
    Returns the cues seen (per episode start) and the episode returns.
    """
    n, delay = env.num_envs, env.delay
    t = np.zeros(n, dtype=int)  # index of the current observation within its episode
    cue = np.full(n, -1)
    cues: list[np.ndarray] = []
    returns: list[float] = []

    def check_obs(step: int) -> None:
        nonlocal cue
        first = t == 0
        assert set(np.unique(buf.obs[first, 0])) <= {-1.0, 1.0}, step  # the cue, on the first obs only
        assert (buf.obs[~first, 0] == 0).all(), step
        assert (buf.obs[:, 1] == (t == delay)).all(), step  # answer flag on observation index `delay` only
        assert (buf.obs[:, 2] == 0).all(), step
        cue = np.where(first, (buf.obs[:, 0] > 0).astype(int), cue)
        if first.any():
            cues.append(cue[first].copy())

    check_obs(-1)
    for step in range(steps):
        actions = policy(cue, t, rng)
        buf.actions[:] = actions
        env.step(buf)
        answer = t == delay
        expected = np.where(answer, np.where(actions == cue, 1.0, -1.0), 0.0)
        np.testing.assert_array_equal(buf.rewards, expected, err_msg=f"step {step}")
        assert (buf.terminated == answer).all(), step
        assert not buf.truncated.any(), step
        assert (buf.episode_done == answer).all(), step
        np.testing.assert_array_equal(buf.episode_return[answer], expected[answer])
        assert (buf.episode_length[answer] == delay + 1).all(), step
        returns.extend(expected[answer].tolist())
        t = np.where(answer, 0, t + 1)  # auto-reset: the obs after the answer is the next episode's first
        check_obs(step)
    return {"cues": np.concatenate(cues), "returns": np.array(returns)}


def _random_actions(cue, t, rng):
    return rng.integers(0, 2, size=len(cue)).astype(np.int32)


@pytest.mark.parametrize("delay", [1, 3, 8])
def test_memory_cue_first_obs_answer_flag_and_reward_sign(delay: int) -> None:
    env = MemoryProbeVec(NUM_ENVS, delay=delay)
    buf, whole = _views(env.spec, NUM_ENVS)
    env.reset(buf, seed=5)
    episodes = 20
    out = _run_memory(env, buf, episodes * (delay + 1), _random_actions, np.random.default_rng(0))
    assert len(out["returns"]) == episodes * NUM_ENVS  # every episode is exactly delay + 1 steps
    assert set(out["returns"].tolist()) == {-1.0, 1.0}  # random answers are sometimes right, sometimes wrong
    assert not buf.final_obs.any()  # never truncated: final_obs stays as reset left it
    _assert_margins_untouched(whole, NUM_ENVS)


def test_memory_right_answers_return_one_wrong_answers_minus_one() -> None:
    env = MemoryProbeVec(NUM_ENVS, delay=4)
    buf = StepBuffers.allocate(env.spec, NUM_ENVS)
    rng = np.random.default_rng(0)
    env.reset(buf, seed=11)
    right = _run_memory(env, buf, 50, lambda cue, t, rng: cue.astype(np.int32), rng)
    assert len(right["returns"]) == 10 * NUM_ENVS and (right["returns"] == 1.0).all()
    env.reset(buf, seed=12)
    wrong = _run_memory(env, buf, 50, lambda cue, t, rng: (1 - cue).astype(np.int32), rng)
    assert len(wrong["returns"]) == 10 * NUM_ENVS and (wrong["returns"] == -1.0).all()


def test_memory_only_the_answer_action_matters() -> None:
    """Actions before the answer are ignored: reward 0 whatever they are, and the cue does not change."""
    env = MemoryProbeVec(4, delay=5)
    buf = StepBuffers.allocate(env.spec, 4)
    env.reset(buf, seed=2)
    cue = (buf.obs[:, 0] > 0).astype(np.int32)
    for t in range(5):
        buf.actions[:] = 1 - cue if t % 2 else cue
        env.step(buf)
        assert (buf.rewards == 0).all() and not buf.episode_done.any()
    buf.actions[:] = cue
    env.step(buf)
    assert (buf.rewards == 1.0).all() and buf.terminated.all()


def test_memory_both_cues_occur_and_are_redrawn_at_auto_reset() -> None:
    env = MemoryProbeVec(64, delay=2)
    buf = StepBuffers.allocate(env.spec, 64)
    env.reset(buf, seed=0)
    out = _run_memory(env, buf, 30 * 3, _random_actions, np.random.default_rng(0))
    cues = out["cues"].reshape(-1, 64)  # [episode, env]
    assert cues.shape[0] == 31
    assert 0.4 < cues.mean() < 0.6  # both cues, about equally often (1984 fair draws: 0.5 +- 0.011)
    assert (cues.min(axis=0) != cues.max(axis=0)).all()  # every env gets both cues over its episodes


def test_memory_is_reproducible_from_the_seed() -> None:
    def trace(seed: int) -> np.ndarray:
        env = MemoryProbeVec(16, delay=3)
        buf = StepBuffers.allocate(env.spec, 16)
        env.reset(buf, seed=seed)
        rng = np.random.default_rng(99)
        seen = [buf.obs.copy()]
        for _ in range(40):
            buf.actions[:] = rng.integers(0, 2, size=16)
            env.step(buf)
            seen.append(np.concatenate([buf.obs.ravel(), buf.rewards]))
        return np.concatenate([s.ravel() for s in seen])

    np.testing.assert_array_equal(trace(4), trace(4))
    assert not np.array_equal(trace(4), trace(5))


def test_memory_rejects_bad_actions_and_step_before_reset() -> None:
    env = MemoryProbeVec(3, delay=2)
    buf = StepBuffers.allocate(env.spec, 3)
    with pytest.raises(RuntimeError, match=r"before reset"):
        env.step(buf)
    env.reset(buf, seed=0)
    buf.actions[:] = [0, 1, -1]
    with pytest.raises(ValueError, match=r"action -1 for env 2 is out of range"):
        env.step(buf)


# --- registry and configs -----------------------------------------------------------------------------------


def test_registry_builds_both_probes() -> None:
    cfg = EnvConfig(name="probe_truncation", max_steps=7)
    assert env_spec(cfg) == TruncationProbeVec.SPEC
    env = make_vec_env(cfg, 3)
    assert isinstance(env, TruncationProbeVec) and env.max_steps == 7 and env.num_envs == 3
    cfg = EnvConfig(name="probe_memory", kwargs={"delay": 5})
    assert env_spec(cfg) == MemoryProbeVec.SPEC
    env = make_vec_env(cfg, 4)
    assert isinstance(env, MemoryProbeVec) and env.delay == 5 and env.num_envs == 4
    assert make_vec_env(EnvConfig(name="probe_memory"), 1).delay == 8


def test_registry_probe_truncation_takes_no_kwargs() -> None:
    cfg = EnvConfig(name="probe_truncation", kwargs={"delay": 3, "b": 1})
    for call in (lambda: env_spec(cfg), lambda: make_vec_env(cfg, 2)):
        with pytest.raises(ValueError) as err:
            call()
        assert str(err.value) == "env.kwargs is not supported for env 'probe_truncation' (got keys ['b', 'delay'])"


def test_registry_probe_truncation_needs_a_time_limit() -> None:
    with pytest.raises(ValueError, match=r"env.max_steps for env 'probe_truncation' must be an integer >= 1 "
                                         r"\(the time limit is the point of this probe\), got 0"):
        env_spec(EnvConfig(name="probe_truncation", max_steps=0))


def test_registry_probe_memory_unknown_kwargs() -> None:
    cfg = EnvConfig(name="probe_memory", kwargs={"delay": 3, "dealy": 4, "cues": 2})
    for call in (lambda: env_spec(cfg), lambda: make_vec_env(cfg, 2)):
        with pytest.raises(ValueError) as err:
            call()
        assert str(err.value) == ("env.kwargs for env 'probe_memory' has unknown keys ['cues', 'dealy']; "
                                  "the only allowed key is 'delay'")


@pytest.mark.parametrize("delay", [0, -2, 2.5, True, "8", None])
def test_registry_probe_memory_bad_delay(delay) -> None:
    cfg = EnvConfig(name="probe_memory", kwargs={"delay": delay})
    for call in (lambda: env_spec(cfg), lambda: make_vec_env(cfg, 2)):
        with pytest.raises(ValueError) as err:
            call()
        assert str(err.value) == f"env.kwargs.delay for env 'probe_memory' must be an integer >= 1, got {delay!r}"


@pytest.mark.parametrize("name", ["probe_truncation", "probe_memory"])
def test_registry_probes_have_one_agent(name: str) -> None:
    cfg = EnvConfig(name=name, num_agents=2)
    for call in (lambda: env_spec(cfg), lambda: make_vec_env(cfg, 2)):
        with pytest.raises(ValueError) as err:
            call()
        assert str(err.value) == f"env.num_agents=2 but env '{name}' has 1 agent per environment"


def test_probe_configs_load_and_plan() -> None:
    trunc = load_config(REPO / "configs" / "probe_truncation.yaml")
    assert trunc.env.name == "probe_truncation" and trunc.env.max_steps == 50 and trunc.env.kwargs == {}
    assert trunc.trainer.gamma == 0.95
    assert env_spec(trunc.env) == TruncationProbeVec.SPEC
    make_plan(trunc.trainer, num_agents=1)  # raises PlanError if the batch arithmetic does not fit
    memory = load_config(REPO / "configs" / "probe_memory.yaml")
    assert memory.env.name == "probe_memory" and memory.env.kwargs == {"delay": 8}
    assert memory.model.core == "lstm" and memory.trainer.bptt_horizon == 16
    assert memory.trainer.target_episode_return == 0.9
    assert env_spec(memory.env) == MemoryProbeVec.SPEC
    make_plan(memory.trainer, num_agents=1)
