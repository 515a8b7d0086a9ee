"""Real learner and actor processes on every kind of env: a real Gymnasium env (single and vector), a real
PettingZoo ParallelEnv (MPE simple_spread, discrete and continuous actions; simple_speaker_listener, whose agents'
spaces differ), the native worked example, and
envs that fail (restarted and counted mid-run; fatal when they cannot reset)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from tests import faulty_envs
from tests.processes import Run, metrics

pytestmark = pytest.mark.integration

SPREAD = "configs/mpe_spread.yaml"


def line_of(function, text: str) -> int:
    """The file line number of the first line of ``function`` that contains ``text``."""
    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(lines) if text in line)


def finish(run: Run, learner, actors, timeout: float = 300) -> list[dict]:
    """Wait for a run that stops by itself; both processes exit 0 and leave nothing behind."""
    assert learner.wait(timeout=timeout) == 0, run.log("learner.log")
    assert actors.wait(timeout=30) == 0, run.log("actors.log")
    run.assert_clean()
    return metrics(run.run_dir)


def test_gymnasium_cartpole_trains(tmp_path) -> None:
    """CartPole-v1 from Gymnasium itself (env.name gymnasium): mean return from ~20 to >= 200."""
    run = Run(tmp_path, "--set", "env.name=gymnasium", "--set", "env.gym_id=CartPole-v1",
              "--set", "trainer.target_episode_return=200")
    try:
        records = finish(run, run.learner(), run.actors(2))
    finally:
        run.close()
    assert "solved: mean return" in run.log("learner.log")
    assert records[0]["episode_return_mean"] < 60 and records[-1]["episode_return_mean"] >= 200


def test_gymnasium_vector_env_runs_end_to_end(tmp_path) -> None:
    """gymnasium.make_vec (NEXT_STEP autoreset: finished sub-envs sit out a step) feeds real updates."""
    run = Run(tmp_path, "--set", "env.name=gymnasium_vector", "--set", "env.entry_point=gymnasium:make_vec",
              "--set", "env.kwargs={id: CartPole-v1, vectorization_mode: sync}", "--set", "env.max_steps=0",
              "--set", "trainer.total_timesteps=60000")
    try:
        records = finish(run, run.learner(), run.actors(2))
    finally:
        run.close()
    assert len(records) >= 5 and records[-1]["episodes"] > 100
    last = records[-1]
    sat_out = last["env_steps"] - last["agent_steps"]  # each episode end costs its sub-env one inactive step
    assert 0 < sat_out <= last["episodes"] + 128, last  # (128: sub-envs whose episode ended in the last step)
    assert np.isfinite([r["policy_loss"] for r in records]).all()


@pytest.mark.slow
def test_pettingzoo_mpe_spread_trains(tmp_path) -> None:
    """MPE simple_spread, 3 agents per env through the ParallelEnv adapter: the return rises above the start (the mean
    of the first 5 records against that of the last 5: one record's mean return moves by about 1 between updates)."""
    run = Run(tmp_path, "--set", "trainer.total_timesteps=400000", config=SPREAD)
    try:
        records = finish(run, run.learner(), run.actors(2))
    finally:
        run.close()
    first, last = records[0], records[-1]
    assert last["agent_steps"] >= 400000 and last["agent_steps"] == 3 * last["env_steps"]
    assert last["episode_length_mean"] == 25
    start, end = (float(np.mean([r["episode_return_mean"] for r in part])) for part in (records[:5], records[-5:]))
    assert end > start + 2.0, (start, end, first, last)


def test_pettingzoo_continuous_actions_run_end_to_end(tmp_path) -> None:
    """Box actions (a diagonal Gaussian policy) through the same adapter: updates with finite losses."""
    run = Run(tmp_path, "--set", "env.kwargs={N: 3, max_cycles: 25, continuous_actions: true}",
              "--set", "trainer.total_timesteps=40000", config=SPREAD)
    try:
        records = finish(run, run.learner(), run.actors(1))
    finally:
        run.close()
    assert len(records) >= 4 and records[-1]["episodes"] > 0
    assert np.isfinite([[r["policy_loss"], r["value_loss"], r["entropy"]] for r in records]).all()
    config = (run.run_dir / "config.yaml").read_text()
    assert "continuous_actions: true" in config


def test_pettingzoo_agents_with_differing_spaces_train(tmp_path) -> None:
    """MPE simple_speaker_listener: a speaker (3 values, 3 words) and a listener (11 values, 5 moves) in one padded
    layout with the speaker's extra moves masked; the shared return rises from about -40 (random) past -25."""
    run = Run(tmp_path, "--set", "trainer.total_timesteps=150000", config="configs/mpe_speaker_listener.yaml")
    try:
        records = finish(run, run.learner(), run.actors(2))
    finally:
        run.close()
    first, last = records[0], records[-1]
    assert last["agent_steps"] >= 150000 and last["agent_steps"] == 2 * last["env_steps"]
    assert first["episode_return_mean"] < -30 and last["episode_return_mean"] > -25, (first, last)


def test_native_worked_example_trains(tmp_path) -> None:
    """examples/corridor.py (masks, early finishers inactive, a named stat): from ~0.3 to >= 0.9."""
    run = Run(tmp_path, config="configs/corridor.yaml")
    try:
        records = finish(run, run.learner(), run.actors(2))
    finally:
        run.close()
    assert records[0]["episode_return_mean"] < 0.6 and records[-1]["episode_return_mean"] >= 0.9
    assert records[-1]["episode_steps_to_goal_mean"] < 6  # walks straight home (at most 7 cells away)
    assert records[-1]["agent_steps"] < 2 * records[-1]["env_steps"]  # agents home early do not count


def test_env_raising_mid_run_is_restarted_and_counted(tmp_path) -> None:
    run = Run(tmp_path, "--set", "env.name=native", "--set", "env.entry_point=tests.faulty_envs:FlakyCartPole",
              "--set", "env.kwargs={fail_every: 40}", "--set", "trainer.total_timesteps=60000",
              "--set", "trainer.target_episode_return=null",
              # the env error reaches the learner with the host's next heartbeat: the run lasts about a second
              "--set", "network.heartbeat_interval_s=0.2")
    try:
        records = finish(run, run.learner(), run.actors(2))
    finally:
        run.close()
    assert records[-1]["env_restarts"] >= 10 and records[-1]["agent_steps"] >= 60000
    log = run.log("actors.log")
    assert "raised and was restarted" in log and "flaky env: failing on step call 40" in log
    assert "env 'native:tests.faulty_envs:FlakyCartPole' raised in step()" in log
    # the user's traceback reaches the host's console, and its type and line reach the learner's log
    raised_at = line_of(faulty_envs.FlakyCartPole.step, "raise RuntimeError")
    assert f'faulty_envs.py", line {raised_at}, in step' in log and "NoneType: None" not in log
    assert f"(RuntimeError at {faulty_envs.__file__}:{raised_at})" in log
    assert (f"env error RuntimeError at {faulty_envs.__file__}:{raised_at}: env "
            "'native:tests.faulty_envs:FlakyCartPole' raised in step()") in run.log("learner.log")


def test_env_that_cannot_reset_stops_its_host_with_the_reason(tmp_path) -> None:
    run = Run(tmp_path, "--set", "env.name=native", "--set", "env.entry_point=tests.faulty_envs:BrokenReset")
    try:
        learner, actors = run.learner(), run.actors(1)
        assert actors.wait(timeout=60) == 1, run.log("actors.log")
        learner.terminate()
        assert learner.wait(timeout=30) == 143  # 128 + SIGTERM: stopped, not finished
        run.assert_clean()
    finally:
        run.close()
    log = run.log("actors.log")
    assert ("python -m actors: error: env worker 0 could not start its env: env "
            "'native:tests.faulty_envs:BrokenReset' raised in reset(): OSError('simulator license server "
            "unreachable')") in log, log
    raised_at = line_of(faulty_envs.BrokenReset.reset, "raise OSError")
    assert f'faulty_envs.py", line {raised_at}, in reset' in log
    assert (f"env error OSError at {faulty_envs.__file__}:{raised_at}: env worker 0 could not start its env"
            in run.log("learner.log"))


def test_an_env_that_hangs_while_built_stops_the_learner_with_one_line_by_the_build_deadline(tmp_path) -> None:
    """The learner reads an external env's spec in a child: one that never finishes building is said as it goes and
    ends the run at env.build_timeout_s, the child gone."""
    run = Run(tmp_path, "--set", "env.name=native", "--set", "env.entry_point=tests.faulty_envs:HangsInBuild",
              "--set", "env.build_timeout_s=12")
    try:
        learner = run.learner()
        assert learner.wait(timeout=90) == 2, run.log("learner.log")
        run.assert_clean()
    finally:
        run.close()
    log = run.log("learner.log")
    assert "learner: building env 'native:tests.faulty_envs:HangsInBuild' to read its spec: 10 s so far " \
           "(env.build_timeout_s 12)" in log, log
    assert "env 'native:tests.faulty_envs:HangsInBuild': building it to read its spec took longer than " \
           "env.build_timeout_s (12 s)" in log, log
    assert "Traceback" not in log
