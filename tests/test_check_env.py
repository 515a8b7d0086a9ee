"""python -m evaluation.check_env: the report on a good env, each problem as one line with its fix, the exit status,
and every CLI error path's message."""

from __future__ import annotations

import numpy as np
import pytest

from envs.base import EnvSpec, StepBuffers
from envs.spaces import ActionSpace
from evaluation.check_env import main, random_actions


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["--seconds", "0.4", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_good_env_reports_its_spaces_encoder_row_size_speed_and_no_problem(capsys):
    code, out, err = _run(capsys, "--config", "cartpole")
    assert code == 0, err
    for expected in ("env: cartpole, 1 agent(s) per env", "observation: shape [4] float32", "action: discrete nvec [2]",
                     "encoder (model.encoder auto): mlp", "one row on the wire: ", "speed, 1 env(s): ",
                     "episodes: ", "no problems found"):
        assert expected in out, out
    assert "speed, 64 env(s): " in out  # the plan's envs per worker
    assert err == ""


def test_an_image_env_with_masks_reports_the_cnn_and_its_masks(capsys):
    code, out, _ = _run(capsys, "--config", "selfplay_connect4")
    assert code == 0
    assert "image layout chw" in out and "with action masks" in out and "encoder (model.encoder auto): cnn" in out


@pytest.mark.integration
def test_nan_rewards_are_one_problem_line_with_its_fix_and_exit_1(capsys):
    code, out, _ = _run(capsys, "--set", "env.name=native", "--set", "env.entry_point=tests.faulty_envs:WritesNaN",
                        "--set", "env.kwargs.env=0")
    assert code == 1
    assert ("problem: rewards hold NaN or inf: every row with one is refused (non_finite); fix the env, or clip and "
            "replace them in a wrapper") in out
    assert out.rstrip().endswith("1 problem(s)")


@pytest.mark.integration
def test_an_env_that_ignores_its_seed_is_reported_as_not_repeatable(capsys):
    code, out, _ = _run(capsys, "--set", "env.name=native",
                        "--set", "env.entry_point=tests.faulty_envs:UnseededCartPole")
    assert code == 1
    assert "problem: the same seed and actions gave different results" in out


@pytest.mark.integration
def test_an_env_that_raises_is_one_line_naming_the_call_and_the_users_line(capsys):
    code, _, err = _run(capsys, "--set", "env.name=native", "--set", "env.entry_point=tests.faulty_envs:FlakyCartPole")
    assert code == 1
    assert err.startswith("python -m evaluation.check_env: the env's step raised RuntimeError: flaky env: failing on "
                          "step call 40 at ")
    assert "tests/faulty_envs.py:" in err and err.count("\n") == 1


def test_rewards_beyond_max_abs_value_are_a_problem(capsys):
    code, out, _ = _run(capsys, "--config", "cartpole", "--set", "network.max_abs_value=0.5")
    assert code == 1
    assert "problem: observations reach " in out and "beyond network.max_abs_value (0.5)" in out
    assert "raise network.max_abs_value" in out


def test_a_config_error_is_one_line_and_exit_2(capsys):
    code, _, err = _run(capsys, "--set", "env.nmae=3")
    assert code == 2
    assert err.startswith("python -m evaluation.check_env: error: ") and "env.nmae" in err and err.count("\n") == 1


def test_an_unknown_shipped_config_is_one_line_and_exit_2(capsys):
    code, _, err = _run(capsys, "--config", "no_such_config")
    assert code == 2
    assert err.startswith("python -m evaluation.check_env: error: ") and "no_such_config" in err


def test_seconds_must_be_positive(capsys):
    assert main(["--seconds", "0"]) == 2
    assert capsys.readouterr().err == "python -m evaluation.check_env: error: --seconds must be > 0, got 0\n"


def test_random_actions_stay_legal_under_masks_and_within_box_bounds():
    rng = np.random.default_rng(0)
    spec = EnvSpec(num_agents=1, obs_shape=(2,), obs_dtype="float32", action=ActionSpace.multi_discrete([3, 4]),
                   action_mask=True)
    buffers = StepBuffers.allocate(spec, 500)
    buffers.action_mask[:] = 0
    buffers.action_mask[:, 1] = 1  # component 0: only action 1
    buffers.action_mask[:, 3 + 2] = buffers.action_mask[:, 3 + 3] = 1  # component 1: actions 2 and 3
    buffers.action_mask[:10, 3:] = 0  # nothing legal in component 1: any action
    random_actions(spec, buffers, rng)
    assert (buffers.actions[:, 0] == 1).all()
    assert set(buffers.actions[10:, 1].tolist()) == {2, 3}
    assert set(buffers.actions[:10, 1].tolist()) <= {0, 1, 2, 3}
    box = EnvSpec(num_agents=1, obs_shape=(2,), obs_dtype="float32", action=ActionSpace(kind="box", low=(-1.0, 0.0),
                                                                                         high=(1.0, 0.5)))
    box_buffers = StepBuffers.allocate(box, 500)
    random_actions(box, box_buffers, rng)
    assert (box_buffers.actions >= [-1.0, 0.0]).all() and (box_buffers.actions <= [1.0, 0.5]).all()
