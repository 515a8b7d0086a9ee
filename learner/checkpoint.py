"""Atomic, pickle-free checkpoints: safetensors for tensors, JSON for everything else.

A checkpoint is a directory ``checkpoints/update_000042/`` holding ``model.safetensors``,
``optimizer.safetensors``, ``optimizer.json``, ``trainer_state.json`` and, when a KL-penalty reference
policy is in use, ``reference.safetensors``. It is written into a hidden
temporary directory, every file fsynced, then renamed into place (rename is atomic), so a crash leaves
either the old set or the new one, never half a checkpoint. The last ``keep`` are kept.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.numpy import load_file, save_file

PREFIX = "update_"


@dataclass(kw_only=True)
class TrainerState:
    """Counters a resumed run continues from."""

    update: int = 0
    """Updates done."""
    policy_version: int = 0
    """Version of the current weights (published after every update)."""
    env_steps: int = 0
    """Env steps reported by actor hosts."""
    agent_steps: int = 0
    """Steps of active agents reported by actor hosts (what total_timesteps and batch_size count)."""
    episodes: int = 0
    """Episodes finished."""
    elapsed_s: float = 0.0
    """Training wall-clock before this process started."""
    recent_returns: list[float] = field(default_factory=list)
    """Returns of the last 100 episodes."""


def save_checkpoint(run_dir: Path, *, policy: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    state: TrainerState, keep: int, reference: torch.nn.Module | None = None) -> Path:
    """Write a checkpoint atomically and prune old ones; returns its directory."""
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"{PREFIX}{state.update:08d}"
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    try:
        save_file(_module_arrays(policy), str(tmp / "model.safetensors"))
        if reference is not None:
            save_file(_module_arrays(reference), str(tmp / "reference.safetensors"))
        tensors, meta = _flatten_optimizer(optimizer.state_dict())
        save_file(tensors, str(tmp / "optimizer.safetensors"))
        (tmp / "optimizer.json").write_text(json.dumps(meta))
        (tmp / "trainer_state.json").write_text(json.dumps(dataclasses.asdict(state)))
        for path in tmp.iterdir():
            _fsync(path)
        aside = root / f".old-{final.name}"
        if final.exists():  # re-saving an update: move the old one aside, never delete it first
            shutil.rmtree(aside, ignore_errors=True)
            os.rename(final, aside)
        os.rename(tmp, final)
        _fsync(root)
        shutil.rmtree(aside, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    for aside in root.glob(".old-*"):  # a crash between the two renames of a re-save: restore the old one
        final = root / aside.name[len(".old-"):]
        if not final.exists():
            os.rename(aside, final)
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX))


def load_checkpoint(path: Path, *, policy: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                    reference: torch.nn.Module | None = None) -> TrainerState:
    """Load weights (and optimiser state, and the reference policy where one was saved) into the given
    objects; returns the trainer state."""
    _load_module(policy, path / "model.safetensors")
    if reference is not None and (path / "reference.safetensors").exists():
        _load_module(reference, path / "reference.safetensors")
    if optimizer is not None:
        meta = json.loads((path / "optimizer.json").read_text())
        tensors = load_file(str(path / "optimizer.safetensors"))
        optimizer.load_state_dict(_unflatten_optimizer(tensors, meta))
    return TrainerState(**json.loads((path / "trainer_state.json").read_text()))


def _module_arrays(module: torch.nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().contiguous().numpy() for k, v in module.state_dict().items()}


def _load_module(module: torch.nn.Module, path: Path) -> None:
    arrays = load_file(str(path))
    module.load_state_dict({k: torch.from_numpy(v) for k, v in arrays.items()}, strict=True)


def _flatten_optimizer(state_dict: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    tensors: dict[str, np.ndarray] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for param_id, param_state in state_dict["state"].items():
        for name, value in param_state.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{param_id}/{name}"] = value.detach().cpu().contiguous().numpy()
            else:
                scalars.setdefault(str(param_id), {})[name] = value
    return tensors, {"param_groups": state_dict["param_groups"], "scalars": scalars}


def _unflatten_optimizer(tensors: dict[str, np.ndarray], meta: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for key, array in tensors.items():
        param_id, name = key.split("/", 1)
        state.setdefault(int(param_id), {})[name] = torch.from_numpy(array)
    for param_id, values in meta["scalars"].items():
        state.setdefault(int(param_id), {}).update(values)
    return {"state": state, "param_groups": meta["param_groups"]}


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
