"""`python -m evaluation.evaluate` and `evaluation.load_policy` on run directories holding a freshly initialised policy."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import imageio.v2 as imageio
import numpy as np
import pytest
import torch
import yaml
from safetensors.numpy import load_file, save_file

from configs.loader import config_to_dict, load_config
from envs.registry import env_spec
from learner.run.checkpoint import LearnedState, TrainerState, list_checkpoints, save_checkpoint
from learner.run.checkpoint_integrity import MANIFEST, write_manifest
from evaluation.evaluate import main
from evaluation.load_policy import LoadPolicyError, load_policy
from policies.factory import make_policy

REPO = Path(__file__).resolve().parents[1]
def read_frames(video: Path) -> list[np.ndarray]:
    """Every frame of an mp4, read back through imageio's ffmpeg plugin."""
    with imageio.get_reader(str(video)) as reader:
        return list(reader.iter_data())


SUMMARY = re.compile(r"mean return (-?[\d.]+) \+- ([\d.]+) \(95% CI\) over (\d+) episodes, mean length ([\d.]+)")


def make_run_dir(run_dir: Path, overrides: list[str], updates: tuple[int, ...] = (3,), *, seed: int = 0) -> Path:
    """A run directory as the learner leaves it: config.yaml and checkpoints of a freshly initialised policy."""
    config = load_config(None, overrides)
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))
    torch.manual_seed(seed)
    policy = make_policy(env_spec(config.env), config.model)
    for update in updates:
        save_checkpoint(run_dir, learned=LearnedState(modules={"model": policy.state_dict()}, optimizers={}),
                        state=TrainerState(update=update), keep=10)
    return run_dir


CARTPOLE = ["env.name=cartpole", "env.max_steps=30"]


@pytest.fixture
def cartpole_run(tmp_path: Path) -> Path:
    return make_run_dir(tmp_path / "run", CARTPOLE, updates=(3, 5))


def evaluate(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_load_policy_reads_config_weights_and_update(cartpole_run: Path) -> None:
    loaded = load_policy(cartpole_run)
    assert loaded.update == 5
    assert not loaded.policy.training
    assert loaded.config.env.name == "cartpole" and loaded.spec.obs_shape == (4,)
    torch.manual_seed(0)
    fresh = make_policy(loaded.spec, loaded.config.model)
    for name, value in fresh.state_dict().items():
        assert torch.equal(loaded.policy.state_dict()[name], value), name
    assert load_policy(cartpole_run, 3).update == 3


def test_evaluate_prints_mean_ci_episodes_and_length(cartpole_run: Path, capsys) -> None:
    code, out, _ = evaluate(capsys, "--run-dir", str(cartpole_run), "--episodes", "3", "--seed", "1")
    assert code == 0
    match = SUMMARY.search(out)
    assert match, out
    mean, half_width, episodes, length = match.groups()
    assert int(episodes) == 3
    assert 1 <= float(mean) <= 30 and 1 <= float(length) <= 30  # cartpole's reward is 1 per step, time limit 30
    assert float(half_width) >= 0


def test_deterministic_runs_are_repeatable(cartpole_run: Path, capsys) -> None:
    first = evaluate(capsys, "--run-dir", str(cartpole_run), "--episodes", "3", "--deterministic", "--seed", "4")
    second = evaluate(capsys, "--run-dir", str(cartpole_run), "--episodes", "3", "--deterministic", "--seed", "4")
    assert first[0] == 0 and SUMMARY.search(first[1])
    assert first[1] == second[1]


def test_video_of_cartpole_is_a_readable_mp4(cartpole_run: Path, tmp_path: Path, capsys) -> None:
    video = tmp_path / "out.mp4"
    code, out, _ = evaluate(capsys, "--run-dir", str(cartpole_run), "--episodes", "3", "--video", str(video))
    assert code == 0 and SUMMARY.search(out)
    written = int(re.search(r"wrote (\d+) frames", out).group(1))
    assert written > 0 and video.stat().st_size > 0
    frames = read_frames(video)
    assert len(frames) == written
    assert frames[0].shape == (240, 384, 3)


@pytest.mark.parametrize(("env_overrides", "shape"), [
    (["env.name=gymnasium", "env.gym_id=CartPole-v1", "env.max_steps=20"], (400, 608, 3)),
    (["env.name=pettingzoo", "env.entry_point=mpe2.simple_speaker_listener_v4:parallel_env", "env.num_agents=2",
      "env.kwargs={max_cycles: 10}", "env.max_steps=0"], (704, 704, 3)),
    (["env.name=pettingzoo_aec", "env.entry_point=pettingzoo.classic.tictactoe_v3:env", "env.num_agents=2",
      "env.max_steps=0"], (1008, 1008, 3)),
], ids=["gymnasium", "mpe-parallel", "tictactoe-aec"])
def test_video_of_an_adapted_env_comes_from_its_own_rgb_array_render(tmp_path: Path, capsys, env_overrides: list[str],
                                                                       shape: tuple[int, int, int]) -> None:
    """Gymnasium's 400 x 600 CartPole, MPE's 700 x 700 and tic-tac-toe's 1000 x 1000 frames, padded to 16s."""
    run_dir = make_run_dir(tmp_path / "run", env_overrides)
    video = tmp_path / "env.mp4"
    code, out, err = evaluate(capsys, "--run-dir", str(run_dir), "--episodes", "2", "--video", str(video))
    assert code == 0, err
    written = int(re.search(r"wrote (\d+) frames", out).group(1))
    frames = read_frames(video)
    assert len(frames) == written > 1
    assert frames[0].shape == shape
    assert frames[0].std() > 0 and (frames[0] != frames[-1]).any()  # a drawn scene, and it moves
    assert "render_mode" not in (run_dir / "config.yaml").read_text()  # the run's config is left as it was


@pytest.mark.parametrize("env_overrides", [
    ["env.name=gridworld", "env.num_agents=3", "env.max_steps=12", "model.core=lstm"],
    ["env.name=connect_four", "env.num_agents=2"],
], ids=["gridworld-lstm", "connect_four"])
def test_multi_agent_recurrent_and_masked_envs_with_video(tmp_path: Path, capsys, env_overrides: list[str]) -> None:
    run_dir = make_run_dir(tmp_path / "run", env_overrides)
    video = tmp_path / "out.mp4"
    code, out, err = evaluate(capsys, "--run-dir", str(run_dir), "--episodes", "4", "--video", str(video))
    assert code == 0, err
    assert int(SUMMARY.search(out).group(3)) == 4
    assert len(read_frames(video)) > 0


def test_missing_run_dir_is_one_line_error(tmp_path: Path, capsys) -> None:
    code, out, err = evaluate(capsys, "--run-dir", str(tmp_path / "nope"))
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [f"python -m evaluation.evaluate: error: run directory {tmp_path / 'nope'} "
                                        f"does not exist"]


def test_a_coma_run_is_one_line_naming_what_scores_it(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    run.mkdir()
    config = load_config(None, ["trainer.algorithm=coma", "trainer.batch_size=2000", "env.name=simple_spread",
                                "env.num_agents=3"])
    (run / "config.yaml").write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))
    code, out, err = evaluate(capsys, "--run-dir", str(run))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "trained COMA (trainer.algorithm coma)" in err and "python -m ops.experiments.coma_spread" in err


def test_run_without_checkpoint_is_an_error(cartpole_run: Path, tmp_path: Path, capsys) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.yaml").write_text((cartpole_run / "config.yaml").read_text())
    code, _, err = evaluate(capsys, "--run-dir", str(empty))
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("python -m evaluation.evaluate: error: ") and "has no checkpoint" in err


def test_absent_checkpoint_lists_available_ones(cartpole_run: Path, capsys) -> None:
    code, _, err = evaluate(capsys, "--run-dir", str(cartpole_run), "--checkpoint", "4")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "checkpoint 4 not found" in err and err.strip().endswith("available: 3, 5")
    with pytest.raises(LoadPolicyError, match="available: 3, 5"):
        load_policy(cartpole_run, 4)


def test_video_of_an_env_it_cannot_draw_is_an_error(tmp_path: Path, capsys) -> None:
    run_dir = make_run_dir(tmp_path / "run", ["env.name=probe_memory"])
    code, _, err = evaluate(capsys, "--run-dir", str(run_dir), "--video", str(tmp_path / "v.mp4"))
    assert code == 2 and "allowed envs: 'cartpole', 'gridworld', 'connect_four'" in err


@pytest.mark.integration
def test_module_runs_as_a_command(cartpole_run: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "evaluation.evaluate", "--run-dir", str(cartpole_run),
                           "--episodes", "2"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert SUMMARY.search(done.stdout)
    assert np.isfinite(float(SUMMARY.search(done.stdout).group(1)))


def test_mode_is_the_most_probable_legal_action() -> None:
    from envs.spaces import ActionSpace
    from policies.distributions import ActionDistribution

    distribution = ActionDistribution(ActionSpace.discrete(3))
    params = torch.tensor([[0.0, 5.0, 1.0], [0.0, 5.0, 1.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 1]], dtype=torch.uint8)
    assert distribution.mode(params, mask).tolist() == [1, 2]
    assert distribution.mode(params, mask).dtype == torch.int32


def damage(checkpoint: Path, how: str) -> None:
    """Damage a checkpoint's weights as a disk or a copy would: a changed byte (the manifest catches it), a cut file
    of a checkpoint written before manifests, or NaN weights behind a manifest that matches them."""
    weights = checkpoint / "model.safetensors"
    data = bytearray(weights.read_bytes())
    if how == "changed byte":
        data[-1] ^= 0xFF
        weights.write_bytes(bytes(data))
    elif how == "cut, no manifest":
        (checkpoint / MANIFEST).unlink()
        weights.write_bytes(bytes(data[: len(data) // 2]))
    else:
        arrays = {name: np.full_like(array, np.nan) for name, array in load_file(str(weights)).items()}
        save_file(arrays, str(weights))
        write_manifest(checkpoint)


@pytest.mark.parametrize("how, reason", [
    ("changed byte", "model.safetensors: sha256 mismatch"),
    ("cut, no manifest", "model.safetensors: not a readable safetensors file"),
    ("NaN weights", "model.safetensors: tensor "),
])
def test_a_damaged_checkpoint_is_one_line_naming_the_file_and_the_other_checkpoints(cartpole_run: Path, capsys,
                                                                                    how: str, reason: str) -> None:
    newest = list_checkpoints(cartpole_run)[-1]
    damage(newest, how)
    code, out, err = evaluate(capsys, "--run-dir", str(cartpole_run))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"python -m evaluation.evaluate: error: checkpoint {newest} is damaged: {reason}"), err
    assert how != "NaN weights" or "holds NaN or inf values" in err
    assert err.strip().endswith("pick another with --checkpoint N (the others: 3)"), err
    assert evaluate(capsys, "--run-dir", str(cartpole_run), "--checkpoint", "3", "--episodes", "1")[0] == 0
