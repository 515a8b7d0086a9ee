"""`python -m evaluation.export`: TorchScript and ONNX files of a checkpoint's policy act as the policy does.

Nothing is trained: each run directory holds a checkpoint of a freshly built policy (``policies.factory.make_policy``)
whose action head and obs_norm statistics are made far from their initial values, so actions differ from
observation to observation and normalisation matters. The written files are run with ``torch.jit.load`` and
onnxruntime and compared, on random observations, with the policy loaded back by ``evaluation.load_policy`` acting
as ``evaluation.episode_runner`` does with ``deterministic``: discrete actions equal, box actions (clipped to the
bounds, as the env receives them) and recurrent states close.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnxruntime  # the test extra (pyproject.toml)
import pytest
import torch
import yaml

from configs.loader import config_to_dict, load_config
from envs.base import EnvSpec
from envs.registry import env_spec
from envs.spaces import ActionSpace
from evaluation import export as export_module
from evaluation.export import io_contract, main, random_inputs
from evaluation.load_policy import LoadedPolicy, load_policy
from learner.run.checkpoint import LearnedState, TrainerState, save_checkpoint
from policies.factory import make_policy

REPO = Path(__file__).resolve().parents[1]
PROG = "python -m evaluation.export"

CASES = {
    "cartpole-mlp": ["env.name=cartpole"],
    "cartpole-mlp-obs_norm": ["env.name=cartpole", "model.obs_norm=true"],
    "gridworld-cnn-obs_norm": ["env.name=gridworld", "model.obs_norm=true"],
    "connect_four-cnn-masks": ["env.name=connect_four", "env.num_agents=2"],
    "connect_four-lstm-masks": ["env.name=connect_four", "env.num_agents=2", "model.core=lstm",
                                "model.hidden_size=32"],
    "tokens": ["env.name=native", "env.entry_point=tests.token_env:PaddedTokenVec"],
    "tokens-lstm": ["env.name=native", "env.entry_point=tests.token_env:PaddedTokenVec", "model.core=lstm"],
    "simple_spread-box-obs_norm": ["env.name=simple_spread", "env.num_agents=3", "model.obs_norm=true"],
}


def sharpen(policy: torch.nn.Module, seed: int) -> None:
    """Weights and statistics a trained policy could have: a large action head (decisive, varied actions; box means
    well past the bounds) and obs_norm statistics far from mean 0, variance 1."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head = policy.actor.linear
        head.weight.copy_(torch.randn(head.weight.shape, generator=generator))
        head.bias.copy_(torch.randn(head.bias.shape, generator=generator))
        norm = policy.encoder.obs_norm
        if norm is not None:
            stats = norm.stats
            stats.mean.copy_(0.3 * torch.randn(stats.mean.shape, generator=generator, dtype=torch.float64))
            stats.var.copy_(torch.rand(stats.var.shape, generator=generator, dtype=torch.float64) + 0.05)
            stats.count.fill_(1000.0)


def make_run(run_dir: Path, overrides: list[str], updates: tuple[int, ...] = (3,), seed: int = 0) -> Path:
    """A run directory as the learner leaves it: config.yaml and checkpoints of a built, untrained policy."""
    config = load_config(None, overrides)
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))
    torch.manual_seed(seed)
    policy = make_policy(env_spec(config.env), config.model)
    sharpen(policy, seed)
    for update in updates:
        save_checkpoint(run_dir, learned=LearnedState(modules={"model": policy.state_dict()}, optimizers={}),
                        state=TrainerState(update=update), keep=10)
    return run_dir


@torch.no_grad()
def expected(loaded: LoadedPolicy, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The loaded policy's deterministic actions (and next states), as evaluation.episode_runner takes them; box
    actions clipped to the bounds as the env adapter clips them."""
    policy, spec = loaded.policy, loaded.spec
    obs = torch.from_numpy(inputs["obs"])
    state = torch.from_numpy(inputs["state"]) if "state" in inputs else torch.zeros((len(obs), 0))
    params, _, next_state = policy.step(obs, state)
    mask = torch.from_numpy(inputs["action_mask"]) if spec.mask_size else None
    actions = policy.distribution.mode(params, mask).numpy()
    if spec.action.kind == "box":
        actions = np.clip(actions, np.float32(spec.action.low), np.float32(spec.action.high))
    return [actions, next_state.numpy()] if policy.state_size else [actions]


def run_file(path: Path, fmt: str, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The exported file's outputs: torch.jit.load for TorchScript, an onnxruntime session for ONNX."""
    if fmt == "torchscript":
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit is deprecated in favour of torch.export
            outputs = torch.jit.load(str(path))(*(torch.from_numpy(a) for a in inputs.values()))
        return [t.numpy() for t in (outputs if isinstance(outputs, tuple) else (outputs,))]
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == list(inputs)
    return session.run(None, inputs)


def export(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
@pytest.mark.parametrize("case", list(CASES))
def test_the_exported_file_acts_as_the_checkpoints_policy(tmp_path: Path, capsys, case: str, fmt: str) -> None:
    run_dir = make_run(tmp_path / "run", CASES[case], updates=(3, 5))
    out = tmp_path / f"policy.{fmt}"
    code, stdout, err = export(capsys, "--run-dir", str(run_dir), "--checkpoint", "3", "--format", fmt,
                               "--out", str(out))
    assert code == 0, err
    assert stdout.strip() == (f"{PROG}: wrote {out} ({fmt}, update 3; checked against the checkpoint's policy on "
                              f"random inputs) and {out}.json")
    loaded = load_policy(run_dir, 3)
    rng = np.random.default_rng(7)
    for batch in (1, 3, 200):
        inputs = random_inputs(loaded.spec, loaded.policy.state_size, batch, rng)
        want, got = expected(loaded, inputs), run_file(out, fmt, inputs)
        assert len(got) == len(want)
        actions, want_actions = got[0], want[0]
        assert actions.dtype == want_actions.dtype and actions.shape == want_actions.shape
        if loaded.spec.action.kind == "box":
            np.testing.assert_allclose(actions, want_actions, rtol=1e-5, atol=1e-5)
        else:
            np.testing.assert_array_equal(actions, want_actions)
        if loaded.policy.state_size:
            np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)
    if batch > 100 and loaded.spec.action.kind != "box":  # the check means something: actions vary
        assert len(np.unique(want_actions)) > 1


def test_masked_actions_are_legal_and_a_component_with_none_legal_is_unmasked(tmp_path: Path, capsys) -> None:
    run_dir = make_run(tmp_path / "run", CASES["connect_four-cnn-masks"])
    out = tmp_path / "c4.pt"
    assert export(capsys, "--run-dir", str(run_dir), "--format", "torchscript", "--out", str(out))[0] == 0
    loaded = load_policy(run_dir)
    inputs = random_inputs(loaded.spec, 0, 300, np.random.default_rng(1))
    inputs["action_mask"][:100] = 0
    inputs["action_mask"][100:200] = 1
    actions = run_file(out, "torchscript", inputs)[0]
    unmasked = expected(loaded, {**inputs, "action_mask": np.ones_like(inputs["action_mask"])})[0]
    np.testing.assert_array_equal(actions[:200], unmasked[:200])  # none legal and all legal both act unmasked
    masks = inputs["action_mask"][200:]
    some_legal = masks.any(axis=1)
    assert some_legal.all() and (masks[np.arange(100), actions[200:]] == 1).all()
    assert (actions[200:] != unmasked[200:]).any()  # the masks changed some choices


def test_box_actions_are_the_mean_clipped_to_the_bounds(tmp_path: Path, capsys) -> None:
    run_dir = make_run(tmp_path / "run", CASES["simple_spread-box-obs_norm"])
    out = tmp_path / "spread.pt"
    assert export(capsys, "--run-dir", str(run_dir), "--format", "torchscript", "--out", str(out))[0] == 0
    loaded = load_policy(run_dir)
    inputs = random_inputs(loaded.spec, 0, 200, np.random.default_rng(2))
    actions = run_file(out, "torchscript", inputs)[0]
    assert actions.dtype == np.float32 and actions.shape == (200, 5)
    with torch.no_grad():
        mean = loaded.policy(torch.from_numpy(inputs["obs"]))[0][:, :5].numpy()
    assert (mean < 0).any() and (mean > 1).any() and ((mean > 0) & (mean < 1)).any()  # every case is exercised
    np.testing.assert_allclose(actions, np.clip(mean, 0, 1), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
def test_multi_discrete_with_masks(tmp_path: Path, fmt: str) -> None:
    """An action space no built-in env has: three components, each masked in its own block."""
    spec = EnvSpec(num_agents=1, obs_shape=(4, 2), obs_dtype="float64", action=ActionSpace.multi_discrete([3, 4, 2]),
                   action_mask=True)
    config = load_config(None, ["env.name=cartpole", "model.core=lstm", "model.hidden_size=16"])
    torch.manual_seed(3)
    policy = make_policy(spec, config.model)
    sharpen(policy, 3)
    loaded = LoadedPolicy(policy=policy.eval(), spec=spec, config=config, update=9)
    out = tmp_path / f"md.{fmt}"
    result = export_module.export_policy(loaded, fmt, out)
    assert result.checked
    inputs = random_inputs(spec, policy.state_size, 100, np.random.default_rng(4))
    got, want = run_file(out, fmt, inputs), expected(loaded, inputs)
    assert got[0].shape == (100, 3) and got[0].dtype == np.int32
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fmt", ["torchscript", "onnx"])
def test_the_sidecar_records_the_io_contract(tmp_path: Path, capsys, fmt: str) -> None:
    run_dir = make_run(tmp_path / "run", CASES["connect_four-lstm-masks"], updates=(4, 8))
    code, _, err = export(capsys, "--run-dir", str(run_dir), "--format", fmt)
    assert code == 0, err
    out = run_dir / "export" / f"policy_update_8.{'pt' if fmt == 'torchscript' else 'onnx'}"
    contract = json.loads(Path(f"{out}.json").read_text())
    assert contract["format"] == fmt and contract["file"] == out.name and contract["checked"] is True
    assert contract["inputs"] == [{"name": "obs", "dtype": "uint8", "shape": ["batch", 2, 6, 7]},
                                  {"name": "action_mask", "dtype": "uint8", "shape": ["batch", 7]},
                                  {"name": "state", "dtype": "float32", "shape": ["batch", 64]}]
    assert contract["outputs"] == [{"name": "actions", "dtype": "int32", "shape": ["batch"]},
                                   {"name": "next_state", "dtype": "float32", "shape": ["batch", 64]}]
    assert contract["action_space"]["kind"] == "discrete" and contract["action_space"]["nvec"] == [7]
    assert contract["source"] | {"run_dir": None} == {"run_dir": None, "update": 8, "weights": "model.safetensors",
                                                     "env": "connect_four", "num_agents": 2, "core": "lstm",
                                                     "encoder": "cnn", "obs_norm": False}
    if fmt == "onnx":
        session = onnxruntime.InferenceSession(str(out), providers=["CPUExecutionProvider"])
        assert [i.name for i in session.get_inputs()] == ["obs", "action_mask", "state"]
        assert [o.name for o in session.get_outputs()] == ["actions", "next_state"]
        assert [i.shape[1:] for i in session.get_inputs()] == [[2, 6, 7], [7], [64]]


def test_the_contract_of_a_box_env_has_its_bounds_and_no_mask_or_state() -> None:
    spec = EnvSpec(num_agents=1, obs_shape=(3,), obs_dtype="float32", action=ActionSpace.box([-1, -math.inf],
                                                                                              [1, math.inf]))
    inputs, outputs = io_contract(spec, 0)
    assert [i.to_json() for i in inputs] == [{"name": "obs", "dtype": "float32", "shape": ["batch", 3]}]
    assert [o.to_json() for o in outputs] == [{"name": "actions", "dtype": "float32", "shape": ["batch", 2]}]
    assert export_module._finite_or_text(-math.inf) == "-inf" and export_module._finite_or_text(1.0) == 1.0


# -- errors ------------------------------------------------------------------------------------------------------

@pytest.fixture
def cartpole_run(tmp_path: Path) -> Path:
    return make_run(tmp_path / "run", CASES["cartpole-mlp"], updates=(3, 5))


def one_line_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"{PROG}: error: "), err
    return lines[0][len(f"{PROG}: error: "):]


def test_a_missing_run_dir_is_a_usage_error(tmp_path: Path, capsys) -> None:
    code, out, err = export(capsys, "--run-dir", str(tmp_path / "nope"), "--format", "onnx")
    assert code == 2 and out == ""
    assert one_line_error(err) == f"run directory {tmp_path / 'nope'} does not exist"


def test_a_run_without_checkpoints_is_a_usage_error(cartpole_run: Path, tmp_path: Path, capsys) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "config.yaml").write_text((cartpole_run / "config.yaml").read_text())
    code, _, err = export(capsys, "--run-dir", str(empty), "--format", "torchscript")
    assert code == 2 and "has no checkpoint" in one_line_error(err)


def test_an_unknown_checkpoint_lists_the_available_ones(cartpole_run: Path, capsys) -> None:
    code, out, err = export(capsys, "--run-dir", str(cartpole_run), "--checkpoint", "4", "--format", "torchscript")
    assert code == 2 and out == ""
    assert one_line_error(err) == f"checkpoint 4 not found in {cartpole_run / 'checkpoints'}; available: 3, 5"
    assert not (cartpole_run / "export").exists()


def test_an_unsupported_format_is_a_usage_error(cartpole_run: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--run-dir", str(cartpole_run), "--format", "tflite"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # argparse's own line (its quoting of the choices varies by Python version)
    assert last.startswith(f"{PROG}: error: argument --format: invalid choice: 'tflite' (choose from ")
    assert "torchscript" in last and "onnx" in last
    with pytest.raises(export_module.ExportError, match="--format 'tflite' is not supported; allowed: torchscript, "
                                                        "onnx"):
        export_module.export_policy(load_policy(cartpole_run), "tflite", cartpole_run / "x")


def test_a_missing_format_is_a_usage_error(cartpole_run: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--run-dir", str(cartpole_run)])
    assert exit_.value.code == 2
    assert "the following arguments are required: --format" in capsys.readouterr().err


def test_a_coma_run_is_unsupported_in_one_line(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    run.mkdir()
    config = load_config(None, ["trainer.algorithm=coma", "trainer.batch_size=2000", "env.name=simple_spread",
                                "env.num_agents=3"])
    (run / "config.yaml").write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))
    code, out, err = export(capsys, "--run-dir", str(run), "--format", "onnx")
    assert code == 2 and out == ""
    assert one_line_error(err) == (f"run {run} trained COMA (trainer.algorithm coma): export supports PPO policies "
                                   f"(model.safetensors) only, not COMA's team actors (actors.safetensors)")


def test_an_out_that_is_a_directory_is_a_usage_error(cartpole_run: Path, tmp_path: Path, capsys) -> None:
    code, _, err = export(capsys, "--run-dir", str(cartpole_run), "--format", "torchscript", "--out", str(tmp_path))
    assert code == 2 and one_line_error(err) == f"--out {tmp_path} is a directory; name the file to write"


def test_an_out_that_cannot_be_written_is_a_failure(cartpole_run: Path, tmp_path: Path, capsys) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    out = blocker / "policy.pt"
    code, out_text, err = export(capsys, "--run-dir", str(cartpole_run), "--format", "torchscript", "--out",
                                 str(out))
    assert code == 1 and out_text == ""
    assert one_line_error(err).startswith(f"cannot write {out}: ")


def test_onnx_without_its_packages_is_a_failure_naming_them(cartpole_run: Path, capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxscript", None)  # import onnxscript raises ImportError
    code, _, err = export(capsys, "--run-dir", str(cartpole_run), "--format", "onnx")
    assert code == 1
    message = one_line_error(err)
    assert message.startswith("--format onnx needs the onnx and onnxscript packages (")
    assert message.endswith("install them with pip install 'sluice[export]'")
    assert not (cartpole_run / "export" / "policy_update_5.onnx").exists()


def test_an_exporter_error_is_a_failure(cartpole_run: Path, capsys, monkeypatch) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("unsupported operator aten::frobnicate\nmore detail")

    monkeypatch.setattr(export_module.torch.jit, "trace", broken)
    code, _, err = export(capsys, "--run-dir", str(cartpole_run), "--format", "torchscript")
    assert code == 1
    assert one_line_error(err) == "torchscript export failed: RuntimeError: unsupported operator aten::frobnicate"


def test_a_file_that_disagrees_with_the_policy_is_a_failure(cartpole_run: Path, capsys, monkeypatch) -> None:
    def off_by_one(actor, inputs):
        return [actions + 1 for actions in reference_outputs(actor, inputs)]

    reference_outputs = export_module.reference_outputs
    monkeypatch.setattr(export_module, "reference_outputs", off_by_one)
    code, _, err = export(capsys, "--run-dir", str(cartpole_run), "--format", "torchscript")
    assert code == 1
    out = cartpole_run / "export" / "policy_update_5.pt"
    assert one_line_error(err).startswith(f"the written {out} disagrees with the checkpoint's policy on a batch of "
                                          f"1: actions differ in 1 of 1 entries")
    assert not Path(f"{out}.json").exists()


def test_onnx_without_onnxruntime_is_written_unchecked(cartpole_run: Path, capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    code, out, err = export(capsys, "--run-dir", str(cartpole_run), "--format", "onnx")
    assert code == 0, err
    assert "(onnx, update 5; not checked: onnxruntime is not installed)" in out
    contract = json.loads((cartpole_run / "export" / "policy_update_5.onnx.json").read_text())
    assert contract["checked"] is False


@pytest.mark.integration
def test_module_runs_as_a_command(cartpole_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "p.pt"
    done = subprocess.run([sys.executable, "-m", "evaluation.export", "--run-dir", str(cartpole_run), "--format",
                           "torchscript", "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "" and out.is_file() and Path(f"{out}.json").is_file()
    missing = subprocess.run([sys.executable, "-m", "evaluation.export", "--run-dir", str(tmp_path / "nope"),
                              "--format", "torchscript"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2
    assert missing.stderr == f"{PROG}: error: run directory {tmp_path / 'nope'} does not exist\n"


def test_a_damaged_checkpoint_is_a_usage_error_naming_the_file(cartpole_run: Path, capsys) -> None:
    newest = cartpole_run / "checkpoints" / "update_00000005"
    weights = newest / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))  # a byte the manifest's sha256 no longer matches
    code, out, err = export(capsys, "--run-dir", str(cartpole_run), "--format", "torchscript")
    assert code == 2 and out == ""
    assert one_line_error(err) == (f"checkpoint {newest} is damaged: model.safetensors: sha256 mismatch; pick another "
                                   f"with --checkpoint N (the others: 3)")
    assert not (cartpole_run / "export").exists()
