"""Checkpoints: exact round trip of model, Adam state and counters; pruning; atomicity; no pickle.

``save`` and ``load`` write and read the file set PPO gives (model, optimizer, an optional reference)."""

from __future__ import annotations

import json
import os
import struct

import pytest
import torch

from envs.base import EnvSpec
from envs.spaces import ActionSpace
from configs.schema import ModelSection
from learner.run import checkpoint as ckpt
from learner.run.checkpoint import LearnedState, TrainerState, list_checkpoints, load_checkpoint, save_checkpoint
from policies.factory import make_policy

SPEC = EnvSpec(num_agents=1, obs_shape=(4,), obs_dtype="float32", action=ActionSpace.discrete(2))
MODEL = ModelSection(hidden_size=16, num_layers=2)
FILES = {"model.safetensors", "optimizer.safetensors", "optimizer.json", "trainer_state.json", "manifest.json"}



def save(run_dir, *, policy, optimizer, state, keep, reference=None):
    modules = {"model": policy.state_dict()}
    if reference is not None:
        modules["reference"] = reference.state_dict()
    learned = LearnedState(modules=modules, optimizers={"optimizer": optimizer.state_dict()})
    return save_checkpoint(run_dir, learned=learned, state=state, keep=keep)


def load(path, *, policy, optimizer=None, reference=None) -> TrainerState:
    checkpoint = load_checkpoint(path)
    policy.load_state_dict(checkpoint.learned.modules["model"])
    if optimizer is not None:
        optimizer.load_state_dict(checkpoint.learned.optimizers["optimizer"])
    if reference is not None and "reference" in checkpoint.learned.modules:
        reference.load_state_dict(checkpoint.learned.modules["reference"])
    return checkpoint.trainer_state


def trained(seed: int = 0, steps: int = 3):
    torch.manual_seed(seed)
    policy = make_policy(SPEC, MODEL)
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2, eps=1e-8)
    for _ in range(steps):
        logits, value = policy(torch.randn(32, 4))
        loss = logits.logsumexp(-1).mean() + (value ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return policy, optimizer


def fresh(seed: int = 123):
    torch.manual_seed(seed)
    policy = make_policy(SPEC, MODEL)
    return policy, torch.optim.Adam(policy.parameters(), lr=5.0)


def state_for(update: int) -> TrainerState:
    return TrainerState(update=update, policy_version=update + 1, env_steps=1000 * update,
                        agent_steps=3000 * update, episodes=7 * update, elapsed_s=1.25 * update,
                        recent_returns=[1.5, 2.0, float(update)])


def norm_groups(groups):
    return [{k: list(v) if isinstance(v, (list, tuple)) else v for k, v in g.items()} for g in groups]


def test_round_trip_model_optimizer_and_state(tmp_path):
    policy, optimizer = trained()
    state = state_for(7)
    path = save(tmp_path, policy=policy, optimizer=optimizer, state=state, keep=3)
    assert path == tmp_path / "checkpoints" / "update_00000007"
    assert {p.name for p in path.iterdir()} == FILES

    policy2, optimizer2 = fresh()
    loaded = load(path, policy=policy2, optimizer=optimizer2)
    assert loaded == state
    for (k, a), (k2, b) in zip(policy.state_dict().items(), policy2.state_dict().items()):
        assert k == k2 and torch.equal(a, b), k

    sd, sd2 = optimizer.state_dict(), optimizer2.state_dict()
    assert norm_groups(sd["param_groups"]) == norm_groups(sd2["param_groups"])
    assert sd2["param_groups"][0]["lr"] == 1e-2
    assert sd["state"].keys() == sd2["state"].keys() and len(sd["state"]) == len(list(policy.parameters()))
    for pid, pstate in sd["state"].items():
        assert pstate.keys() == sd2["state"][pid].keys()
        for name, value in pstate.items():
            other = sd2["state"][pid][name]
            if isinstance(value, torch.Tensor):
                assert torch.equal(value, torch.as_tensor(other)), (pid, name)
            else:
                assert value == other, (pid, name)

    # the restored optimiser continues exactly like the original
    torch.manual_seed(99)
    x = torch.randn(16, 4)
    for pol, opt in ((policy, optimizer), (policy2, optimizer2)):
        logits, value = pol(x)
        loss = logits.logsumexp(-1).mean() + (value ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    for a, b in zip(policy.parameters(), policy2.parameters()):
        assert torch.equal(a, b)


def test_load_without_optimizer(tmp_path):
    policy, optimizer = trained()
    path = save(tmp_path, policy=policy, optimizer=optimizer, state=state_for(1), keep=1)
    policy2, _ = fresh()
    assert load(path, policy=policy2).update == 1
    for a, b in zip(policy.parameters(), policy2.parameters()):
        assert torch.equal(a, b)


def test_reference_policy_round_trip(tmp_path):
    policy, optimizer = trained()
    reference, _ = trained(seed=5, steps=1)
    path = save(tmp_path, policy=policy, optimizer=optimizer, state=state_for(2), keep=1, reference=reference)
    assert (path / "reference.safetensors").exists()
    policy2, optimizer2 = fresh()
    reference2, _ = fresh(seed=9)
    load(path, policy=policy2, optimizer=optimizer2, reference=reference2)
    for a, b in zip(reference.parameters(), reference2.parameters()):
        assert torch.equal(a, b)
    for a, b in zip(policy.parameters(), policy2.parameters()):
        assert torch.equal(a, b)
    # a checkpoint without a reference leaves the given reference as it was
    plain = save(tmp_path, policy=policy, optimizer=optimizer, state=state_for(3), keep=1)
    assert not (plain / "reference.safetensors").exists()
    untouched, _ = fresh(seed=9)
    load(plain, policy=policy2, reference=untouched)
    for a, b in zip(untouched.parameters(), fresh(seed=9)[0].parameters()):
        assert torch.equal(a, b)


def test_keep_newest_only_and_no_temp_dirs(tmp_path):
    policy, optimizer = trained()
    for update in (1, 2, 5, 10, 11):
        save(tmp_path, policy=policy, optimizer=optimizer, state=state_for(update), keep=3)
        root = tmp_path / "checkpoints"
        assert not [p for p in root.iterdir() if p.name.startswith(".tmp-")]
    names = [p.name for p in list_checkpoints(tmp_path)]
    assert names == ["update_00000005", "update_00000010", "update_00000011"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == names
    save(tmp_path, policy=policy, optimizer=optimizer, state=state_for(12), keep=1)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["update_00000012"]


def test_list_checkpoints_empty_and_ignores_other_entries(tmp_path):
    assert list_checkpoints(tmp_path) == []
    root = tmp_path / "checkpoints"
    (root / ".tmp-abc").mkdir(parents=True)
    (root / "update_00000003").mkdir()
    (root / "update_00000004.txt").write_text("x")
    assert [p.name for p in list_checkpoints(tmp_path)] == ["update_00000003"]


def test_resave_same_update_replaces(tmp_path):
    policy, optimizer = trained()
    save(tmp_path, policy=policy, optimizer=optimizer, state=state_for(4), keep=3)
    state = state_for(4)
    state.episodes = 999
    path = save(tmp_path, policy=policy, optimizer=optimizer, state=state, keep=3)
    assert len(list_checkpoints(tmp_path)) == 1
    assert load(path, policy=fresh()[0]).episodes == 999


def test_failed_save_keeps_previous_and_leaves_no_temp(tmp_path, monkeypatch):
    policy, optimizer = trained()
    previous = save(tmp_path, policy=policy, optimizer=optimizer, state=state_for(1), keep=1)
    before = {p.name: p.read_bytes() for p in previous.iterdir()}

    real_save = ckpt.save_file
    calls = []

    def flaky(tensors, filename, *args, **kwargs):
        calls.append(filename)
        if len(calls) > 1:
            raise OSError("disk full")
        return real_save(tensors, filename, *args, **kwargs)

    monkeypatch.setattr(ckpt, "save_file", flaky)
    policy2, optimizer2 = trained(seed=1, steps=5)
    with pytest.raises(OSError, match="disk full"):
        save(tmp_path, policy=policy2, optimizer=optimizer2, state=state_for(2), keep=1)
    assert len(calls) == 2

    root = tmp_path / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["update_00000001"]
    assert {p.name: p.read_bytes() for p in previous.iterdir()} == before
    restored, _ = fresh()
    assert load(previous, policy=restored).update == 1
    for a, b in zip(policy.parameters(), restored.parameters()):
        assert torch.equal(a, b)


def test_failed_save_of_same_update_keeps_it(tmp_path, monkeypatch):
    policy, optimizer = trained()
    path = save(tmp_path, policy=policy, optimizer=optimizer, state=state_for(3), keep=2)
    monkeypatch.setattr(ckpt, "save_file", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError):
        save(tmp_path, policy=policy, optimizer=optimizer, state=state_for(3), keep=2)
    assert {p.name for p in path.iterdir()} == FILES
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["update_00000003"]


def _safetensors_header(path):
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    assert 0 < length <= len(data) - 8
    header = json.loads(data[8:8 + length].decode("utf-8"))
    return data, header


def test_files_are_pickle_free(tmp_path, monkeypatch):
    policy, optimizer = trained()
    path = save(tmp_path, policy=policy, optimizer=optimizer, state=state_for(2), keep=1)
    data, header = _safetensors_header(path / "model.safetensors")
    assert set(policy.state_dict()) <= set(header)
    for name, tensor in policy.state_dict().items():
        assert header[name]["shape"] == list(tensor.shape) and header[name]["dtype"] == "F32"
    _, opt_header = _safetensors_header(path / "optimizer.safetensors")
    assert any(k.endswith("/exp_avg") for k in opt_header) and any(k.endswith("/exp_avg_sq") for k in opt_header)
    assert json.loads((path / "trainer_state.json").read_text())["update"] == 2
    json.loads((path / "optimizer.json").read_text())
    for file in path.iterdir():
        raw = file.read_bytes()
        if file.suffix == ".safetensors":  # u64 header length, then a JSON header
            assert raw[8:9] == b"{", file.name
        else:
            assert file.suffix == ".json" and not raw.startswith(b"\x80"), file.name  # pickle opcode
        assert not raw.startswith(b"PK"), file.name  # torch.save zip archive
    # loading needs no torch.load (the pickle path)
    monkeypatch.setattr(torch, "load", None)
    restored, _ = fresh()
    assert load(path, policy=restored).update == 2


@pytest.mark.parametrize("crash_on_rename", [1, 2])
def test_resave_same_update_is_atomic(tmp_path, monkeypatch, crash_on_rename):
    """A crash at either rename of a re-save (old aside, new into place) still leaves a checkpoint."""
    policy, optimizer = trained()
    save(tmp_path, policy=policy, optimizer=optimizer, state=state_for(5), keep=1)
    real_rename, calls = os.rename, []

    def crash(*args, **kwargs):
        calls.append(args)
        if len(calls) == crash_on_rename:
            raise KeyboardInterrupt("killed mid-save")
        return real_rename(*args, **kwargs)

    monkeypatch.setattr(os, "rename", crash)
    with pytest.raises(KeyboardInterrupt):
        save(tmp_path, policy=policy, optimizer=optimizer, state=state_for(5), keep=1)
    monkeypatch.undo()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["update_00000005"]
