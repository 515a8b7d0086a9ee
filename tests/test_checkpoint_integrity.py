"""Checkpoints a run can trust: the manifest, finite weights and checked counters on load; the fall-back to the
newest intact checkpoint; --checkpoint N; a cut or empty config.yaml refused on --resume; and, with real
processes, a damaged newest checkpoint that a resumed learner names and steps back from."""

from __future__ import annotations

import json
import re
import signal
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load, save

from configs.loader import load_config
from configs.schema import ModelSection
from envs.base import EnvSpec
from envs.spaces import ActionSpace
from learner.run.checkpoint import LearnedState, TrainerState, list_checkpoints, load_checkpoint, save_checkpoint
from learner.run.checkpoint_integrity import MANIFEST, CheckpointDamaged, write_manifest
from learner.cli import main
from learner.run.resume_point import NoIntactCheckpoint, pick_checkpoint, settle
from learner.run.run_dir import RunDirError, new_run_dir, resume_config
from policies.factory import make_policy
from tests.processes import REPO, Run, metrics, start, wait_for

SPEC = EnvSpec(num_agents=1, obs_shape=(4,), obs_dtype="float32", action=ActionSpace.discrete(2))
CARTPOLE = str(REPO / "configs" / "cartpole.yaml")


def state_for(update: int) -> TrainerState:
    return TrainerState(update=update, policy_version=update, env_steps=100 * update, agent_steps=100 * update,
                        episodes=3 * update, elapsed_s=0.5 * update, recent_returns=[1.0, 2.5])


def save_one(run_dir: Path, update: int, *, keep: int = 5) -> Path:
    torch.manual_seed(update)
    policy = make_policy(SPEC, ModelSection(hidden_size=8, num_layers=1))
    optimizer = torch.optim.Adam(policy.parameters())
    policy(torch.randn(4, 4))[0].sum().backward()
    optimizer.step()
    learned = LearnedState(modules={"model": policy.state_dict()}, optimizers={"optimizer": optimizer.state_dict()})
    return save_checkpoint(run_dir, learned=learned, state=state_for(update), keep=keep)


def damaged(path: Path, match: str) -> None:
    with pytest.raises(CheckpointDamaged, match=match):
        load_checkpoint(path)


def flip_exponents(file: Path, every: int = 37) -> None:
    """Flip the exponent byte (the high byte, little-endian) of every ``every``-th float32 of a safetensors file."""
    data = bytearray(file.read_bytes())
    (header_len,) = struct.unpack("<Q", data[:8])
    start = 8 + header_len
    for offset in range(start + 3, len(data), 4 * every):
        data[offset] ^= 0x40
    file.write_bytes(bytes(data))


def rewrite(file: Path, content: bytes) -> None:
    """Change a file and its manifest entry alike: damage that only the content checks can find."""
    file.write_bytes(content)
    (file.parent / MANIFEST).unlink()
    write_manifest(file.parent)


def test_manifest_is_written_last_and_lists_every_file(tmp_path):
    path = save_one(tmp_path, 3)
    manifest = json.loads((path / MANIFEST).read_text())
    assert set(manifest["files"]) == {"model.safetensors", "optimizer.safetensors", "optimizer.json",
                                      "trainer_state.json"}
    assert all(len(entry["sha256"]) == 64 and entry["size"] > 0 for entry in manifest["files"].values())
    assert load_checkpoint(path).trainer_state == state_for(3)


def test_the_manifest_is_the_last_file_written(tmp_path, monkeypatch):
    from learner.run import checkpoint as ckpt
    seen: list[set[str]] = []

    def recording(directory: Path) -> Path:
        seen.append({p.name for p in directory.iterdir()})
        return write_manifest(directory)

    monkeypatch.setattr(ckpt, "write_manifest", recording)
    path = save_one(tmp_path, 1)
    assert seen == [{p.name for p in path.iterdir()} - {MANIFEST}]


@pytest.mark.integration
def test_flipped_exponent_bytes_are_a_sha256_mismatch(tmp_path):
    path = save_one(tmp_path, 1)
    flip_exponents(path / "model.safetensors")
    damaged(path, r"^model.safetensors: sha256 mismatch$")


def test_nan_weights_are_damage_even_when_the_manifest_agrees(tmp_path):
    path = save_one(tmp_path, 1)
    arrays = load((path / "model.safetensors").read_bytes())
    name = sorted(arrays)[0]
    arrays[name] = np.full_like(arrays[name], np.nan)
    rewrite(path / "model.safetensors", save(arrays))
    damaged(path, rf"^model.safetensors: tensor '{name}' holds NaN or inf values$")


def test_inf_in_the_optimizer_state_is_damage(tmp_path):
    path = save_one(tmp_path, 1)
    arrays = load((path / "optimizer.safetensors").read_bytes())
    name = sorted(arrays)[0]
    arrays[name] = np.full_like(arrays[name], np.inf)
    rewrite(path / "optimizer.safetensors", save(arrays))
    damaged(path, r"^optimizer.safetensors: tensor .* holds NaN or inf values$")


def test_a_truncated_file_is_named_with_its_sizes(tmp_path):
    path = save_one(tmp_path, 1)
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    damaged(path, rf"^model.safetensors: {len(data) // 2} bytes, the manifest says {len(data)} \(cut short\?\)$")


def test_a_truncated_file_without_a_manifest_is_unreadable(tmp_path):
    path = save_one(tmp_path, 1)
    (path / MANIFEST).unlink()
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    damaged(path, r"^model.safetensors: not a readable safetensors file")


def test_a_missing_file_is_named(tmp_path):
    path = save_one(tmp_path, 1)
    (path / "optimizer.json").unlink()
    damaged(path, r"^optimizer.json: missing$")
    (path / MANIFEST).unlink()
    (path / "trainer_state.json").unlink()
    damaged(path, r"^trainer_state.json: missing$")


@pytest.mark.parametrize(("change", "message"), [
    ({"update": -5}, "'update' is -5, must be an integer >= 0"),
    ({"policy_version": "7"}, "'policy_version' is '7', must be an integer >= 0"),
    ({"episodes": True}, "'episodes' is True, must be an integer >= 0"),
    ({"env_steps": 2.5}, "'env_steps' is 2.5, must be an integer >= 0"),
    ({"elapsed_s": float("nan")}, "'elapsed_s' is nan, must be a finite number >= 0"),
    ({"elapsed_s": -1.0}, "'elapsed_s' is -1.0, must be a finite number >= 0"),
    ({"recent_returns": [1.0, "x"]}, "'recent_returns' must be a list of finite numbers"),
    ({"recent_returns": [float("inf")]}, "'recent_returns' must be a list of finite numbers"),
    ({"recent_returns": 3}, "'recent_returns' must be a list of finite numbers"),
    ({"extra": 1}, "fields missing: [], unknown: ['extra']"),
])
def test_bad_trainer_state_values_are_named(tmp_path, change, message):
    path = save_one(tmp_path, 4)
    raw = {**json.loads((path / "trainer_state.json").read_text()), **change}
    rewrite(path / "trainer_state.json", json.dumps(raw).encode())
    with pytest.raises(CheckpointDamaged) as info:
        load_checkpoint(path)
    assert str(info.value) == f"trainer_state.json: {message}"


def test_a_missing_trainer_state_field_is_named(tmp_path):
    path = save_one(tmp_path, 4)
    raw = json.loads((path / "trainer_state.json").read_text())
    del raw["agent_steps"]
    rewrite(path / "trainer_state.json", json.dumps(raw).encode())
    damaged(path, r"^trainer_state.json: fields missing: \['agent_steps'\], unknown: \[\]$")


def test_garbled_json_is_damage_with_and_without_a_manifest(tmp_path):
    path = save_one(tmp_path, 2)
    (path / "trainer_state.json").write_text('{"update": 2, "poli')
    damaged(path, r"^trainer_state.json: ")  # the manifest sees it first (a size or sha256 mismatch)
    (path / MANIFEST).unlink()
    damaged(path, r"^trainer_state.json: not valid JSON \(cut short\?\)$")
    (path / "trainer_state.json").write_text(json.dumps(state_for(2).__dict__))
    (path / "optimizer.json").write_text("[1, 2")
    damaged(path, r"^optimizer.json: not valid JSON \(cut short\?\)$")


def test_a_garbled_manifest_is_damage(tmp_path):
    path = save_one(tmp_path, 2)
    (path / MANIFEST).write_text('{"files": {"model.safe')
    damaged(path, r"^manifest.json: unreadable \(JSONDecodeError\)$")


def test_a_checkpoint_older_code_wrote_loads_with_a_note(tmp_path):
    path = save_one(tmp_path, 2)
    (path / MANIFEST).unlink()
    point = pick_checkpoint(tmp_path)
    assert point.path == path and point.checkpoint.trainer_state == state_for(2)
    assert point.notes() == ["learner: note: checkpoint update_00000002 has no manifest.json (older code wrote it): "
                             "its files' checksums are not checked, only its weights and counters"]


@pytest.mark.integration
def test_the_newest_intact_checkpoint_is_chosen_and_the_damaged_ones_moved_aside(tmp_path):
    for update in (10, 20, 30, 40):
        save_one(tmp_path, update)
    root = tmp_path / "checkpoints"
    flip_exponents(root / "update_00000040" / "model.safetensors")
    (root / "update_00000030" / "optimizer.json").unlink()
    point = pick_checkpoint(tmp_path)
    assert point.path.name == "update_00000020" and point.checkpoint.trainer_state.update == 20
    assert point.notes() == [
        "learner: checkpoint update_00000040 is damaged (model.safetensors: sha256 mismatch)",
        "learner: checkpoint update_00000030 is damaged (optimizer.json: missing); resuming from update_00000020",
    ]
    assert [p.name for p in list_checkpoints(tmp_path)][-1] == "update_00000040"  # picking changes nothing
    said: list[str] = []
    settle(point, say=said.append)
    assert said == point.notes()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["update_00000010", "update_00000020"]
    assert (root / "damaged-update_00000040").is_dir() and (root / "damaged-update_00000030").is_dir()
    # the damaged ones moved aside no longer count: a new save of update 30 is kept, the oldest pruned
    save_one(tmp_path, 30, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["update_00000020", "update_00000030"]


@pytest.mark.integration
def test_one_damaged_newest_says_it_in_one_line(tmp_path):
    for update in (30, 40):
        save_one(tmp_path, update)
    flip_exponents(tmp_path / "checkpoints" / "update_00000040" / "model.safetensors")
    assert pick_checkpoint(tmp_path).notes() == [
        "learner: checkpoint update_00000040 is damaged (model.safetensors: sha256 mismatch); resuming from "
        "update_00000030"]


@pytest.mark.integration
def test_no_intact_checkpoint_is_one_error_naming_each(tmp_path):
    for update in (1, 2):
        save_one(tmp_path, update)
    root = tmp_path / "checkpoints"
    flip_exponents(root / "update_00000002" / "model.safetensors")
    (root / "update_00000001" / "model.safetensors").unlink()
    with pytest.raises(NoIntactCheckpoint) as info:
        pick_checkpoint(tmp_path)
    assert str(info.value) == (f"cannot resume: no intact checkpoint in {root} (update_00000002: model.safetensors: "
                               "sha256 mismatch; update_00000001: model.safetensors: missing)")


def test_checkpoint_n_picks_one_and_sets_the_newer_aside(tmp_path):
    for update in (1, 2, 3):
        save_one(tmp_path, update)
    point = pick_checkpoint(tmp_path, 1)
    assert point.path.name == "update_00000001" and point.notes() == []
    settle(point, say=print)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["update_00000001"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        "superseded-update_00000002", "superseded-update_00000003", "update_00000001"]


@pytest.mark.integration
def test_checkpoint_n_that_does_not_exist_or_is_damaged_names_the_ones_that_exist(tmp_path):
    for update in (1, 2):
        save_one(tmp_path, update)
    root = tmp_path / "checkpoints"
    with pytest.raises(RunDirError) as missing:
        pick_checkpoint(tmp_path, 5)
    assert str(missing.value) == (f"cannot resume from --checkpoint 5: {root / 'update_00000005'} does not exist; "
                                  "the run has update_00000001, update_00000002")
    flip_exponents(root / "update_00000001" / "model.safetensors")
    with pytest.raises(NoIntactCheckpoint) as broken:
        pick_checkpoint(tmp_path, 1)
    assert str(broken.value) == ("cannot resume from --checkpoint 1: update_00000001 is damaged (model.safetensors: "
                                 "sha256 mismatch); the run has update_00000001, update_00000002")


def error_lines(err: str) -> list[str]:
    """The CLI's error lines (what follows its prefix); no traceback allowed."""
    assert "Traceback" not in err, err
    prefix = "python -m learner: error: "
    return [line[len(prefix):] for line in err.splitlines() if line.startswith(prefix)]


def cli_run_dir(tmp_path: Path) -> Path:
    """A cartpole run directory (config.yaml, one checkpoint of update 2, metrics.jsonl of updates 1-3)."""
    run_dir = new_run_dir(load_config(CARTPOLE), tmp_path / "run")
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"update": u, "agent_steps": u}) + "\n"
                                                   for u in (1, 2, 3)))
    return run_dir


def test_resume_with_only_damaged_checkpoints_is_one_line_exit_1_and_rewrites_nothing(tmp_path, capsys):
    run_dir = cli_run_dir(tmp_path)
    path = save_one(run_dir, 2)
    raw = {**json.loads((path / "trainer_state.json").read_text()), "update": -5}
    rewrite(path / "trainer_state.json", json.dumps(raw).encode())
    before = (run_dir / "metrics.jsonl").read_text()
    assert main(["--resume", "--run-dir", str(run_dir)]) == 1
    assert error_lines(capsys.readouterr().err) == [
        f"cannot resume: no intact checkpoint in {run_dir / 'checkpoints'} (update_00000002: trainer_state.json: "
        "'update' is -5, must be an integer >= 0)"]
    assert (run_dir / "metrics.jsonl").read_text() == before
    assert list_checkpoints(run_dir) == [path]


def test_resume_checkpoint_flag_errors_are_one_line(tmp_path, capsys):
    run_dir = cli_run_dir(tmp_path)
    save_one(run_dir, 2)
    assert main(["--resume", "--run-dir", str(run_dir), "--checkpoint", "7"]) == 2
    assert error_lines(capsys.readouterr().err) == [
        f"cannot resume from --checkpoint 7: {run_dir / 'checkpoints' / 'update_00000007'} does not exist; the run "
        "has update_00000002"]
    assert main(["--run-dir", str(tmp_path / "other"), "--checkpoint", "7"]) == 2
    assert error_lines(capsys.readouterr().err) == ["--checkpoint only goes with --resume"]


def test_an_empty_config_yaml_is_refused(tmp_path, capsys):
    run_dir = cli_run_dir(tmp_path)
    save_one(run_dir, 2)
    (run_dir / "config.yaml").write_text("")
    with pytest.raises(RunDirError) as info:
        resume_config(run_dir, [])
    assert str(info.value) == (f"cannot resume: {run_dir / 'config.yaml'} is empty (cut short when it was written?); "
                               "restore the run's config")
    assert main(["--resume", "--run-dir", str(run_dir)]) == 2
    assert error_lines(capsys.readouterr().err) == [str(info.value)]


def test_a_half_config_yaml_names_the_missing_sections_and_keys(tmp_path):
    run_dir = cli_run_dir(tmp_path)
    path = run_dir / "config.yaml"
    text = path.read_text()
    cut = text.index("  minibatch_size:")  # inside trainer: its later keys and every later section are gone
    path.write_text(text[:cut])
    with pytest.raises(RunDirError) as info:
        resume_config(run_dir, [])
    message = str(info.value)
    assert message.startswith(f"cannot resume: {path} is missing sections model, network, selfplay, coma, evaluation "
                              "and keys trainer.minibatch_size, ")
    assert message.endswith(" more (cut short?); restore the run's config (a missing key can be given with --set), "
                            "it is never filled in with defaults")
    assert "\n" not in message


def test_a_config_yaml_cut_mid_line_or_missing_one_key(tmp_path):
    run_dir = cli_run_dir(tmp_path)
    path = run_dir / "config.yaml"
    text = path.read_text()
    path.write_text(text + "evaluation: [1, 2")
    with pytest.raises(RunDirError, match=r"is not valid YAML at line \d+ \(cut short\?\): ") as info:
        resume_config(run_dir, [])
    assert "\n" not in str(info.value)
    lines = text.splitlines(keepends=True)
    path.write_text("".join(lines[:-1]))  # the last key of the last section: the end of the file is gone
    last_key = f"evaluation.{lines[-1].split(':')[0].strip()}"
    with pytest.raises(RunDirError, match=rf"is missing keys {re.escape(last_key)} \(cut short\?\)"):
        resume_config(run_dir, [])
    value = lines[-1].split(":", 1)[1].strip()
    assert resume_config(run_dir, [f"{last_key}={value}"]) is not None  # a key given with --set


def test_keys_a_later_version_added_inside_a_whole_config_take_their_defaults_with_one_line(tmp_path, caplog):
    run_dir = cli_run_dir(tmp_path)
    path = run_dir / "config.yaml"
    text = path.read_text()
    path.write_text(text.replace("  stall_factor: 10.0\n", "", 1).replace("  step_timeout_s: 60.0\n", "", 1))
    with caplog.at_level("WARNING", logger="sluice.learner"):
        config = resume_config(run_dir, [])
    assert config.run.stall_factor == 10.0 and config.env.step_timeout_s == 60.0
    assert [record.getMessage() for record in caplog.records] == [
        f"learner: {path} has no run.stall_factor, env.step_timeout_s (keys added to Sluice since this run began): "
        "their defaults apply"]


@pytest.fixture
def run(tmp_path):
    r = Run(tmp_path, "--set", "trainer.target_episode_return=null", "--set", "run.checkpoint_interval=1",
            "--set", "run.keep_checkpoints=5", "--set", "trainer.batch_size=2048",
            "--set", "trainer.minibatch_size=1024", "--plain")
    yield r
    r.close()


@pytest.mark.integration
def test_a_resumed_learner_names_the_damaged_checkpoint_and_resumes_from_the_previous(run):
    learner, actors = run.learner(), run.actors(1)
    assert wait_for(lambda: len(metrics(run.run_dir)) >= 3, 120), run.log("learner.log")
    learner.send_signal(signal.SIGTERM)
    assert learner.wait(timeout=30) == 143, run.log("learner.log")
    assert actors.wait(timeout=30) == 0, run.log("actors.log")
    records = metrics(run.run_dir)
    newest, previous = list_checkpoints(run.run_dir)[-2:][::-1]
    last = records[-1]["update"]
    assert newest.name == f"update_{last:08d}" and previous.name == f"update_{last - 1:08d}"
    flip_exponents(newest / "model.safetensors")

    resumed = start("learner", "--resume", "--run-dir", str(run.run_dir), "--set", f"network.port={run.port}",
                    "--plain", log=run.tmp / "resumed.log")  # no actor host: nothing trains
    run.procs.append(resumed)
    assert wait_for(lambda: "listening on" in run.log("resumed.log"), 60), run.log("resumed.log")
    resumed.send_signal(signal.SIGTERM)
    assert resumed.wait(timeout=30) == 143, run.log("resumed.log")
    out = run.log("resumed.log")
    expected = (f"learner: checkpoint {newest.name} is damaged (model.safetensors: sha256 mismatch); resuming from "
                f"{previous.name}")
    assert [line for line in out.splitlines() if line.startswith("learner: ") and "damaged" in line] == [expected]
    assert "Traceback" not in out
    assert [r["update"] for r in metrics(run.run_dir)] == [r["update"] for r in records][:-1]
    assert [p.name for p in list_checkpoints(run.run_dir)][-1] == previous.name
    assert (newest.parent / f"damaged-{newest.name}").is_dir()
    assert load_checkpoint(previous).trainer_state.update == last - 1
