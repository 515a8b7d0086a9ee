"""Atomic, pickle-free checkpoints: safetensors for tensors, JSON for everything else.

A checkpoint is a directory ``checkpoints/update_000042/`` holding ``trainer_state.json`` and the
algorithm's ``LearnedState``: one ``<name>.safetensors`` per module and, per optimizer, ``<name>.safetensors``
(its tensors) plus ``<name>.json`` (param groups and scalars). PPO's names give ``model.safetensors``,
``optimizer.safetensors``, ``optimizer.json`` and, when a KL-penalty reference policy is in use,
``reference.safetensors``. It is written into a hidden temporary directory, every file fsynced, then renamed
into place (rename is atomic), so a crash leaves either the old set or the new one, never half a checkpoint.
The last file written is ``manifest.json`` (sizes and sha256 of the others); ``load_checkpoint`` checks it, the
weights' finiteness and the trainer state (learner/run/checkpoint_integrity.py) and raises ``CheckpointDamaged``.
A disk error while saving is ``RunFilesError`` (learner/run/run_files.py), with the temporary directory removed.
The last ``keep`` are kept.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.numpy import load, save

from learner.run.atomic import atomic_directory, restore_set_aside
from learner.run.checkpoint_integrity import (CheckpointDamaged, check_finite, checked_trainer_state, read_json,
                                          verify_manifest, write_manifest)
from learner.run.run_files import writing

PREFIX = "update_"
TRAINER_STATE = "trainer_state"


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


@dataclass(frozen=True, kw_only=True)
class LearnedState:
    """What a checkpoint keeps of an algorithm (its ``state_dict()``), each part named by its file stem."""

    modules: dict[str, dict[str, torch.Tensor]]
    """Module state dicts (PPO: the policy as ``model``, the KL reference as ``reference``): <name>.safetensors."""
    optimizers: dict[str, dict[str, Any]]
    """Optimizer state dicts (PPO: ``optimizer``): tensors in <name>.safetensors, the rest in <name>.json."""

    def __post_init__(self) -> None:
        names = [*self.modules, *self.optimizers, TRAINER_STATE]
        if len(set(names)) != len(names):
            raise ValueError(f"checkpoint part names {names[:-1]} repeat or use {TRAINER_STATE!r}: files would clash")


@dataclass(frozen=True, kw_only=True)
class Checkpoint:
    """A checkpoint as read back from its directory."""

    trainer_state: TrainerState
    """The counters the run continues from."""
    learned: LearnedState
    """The algorithm's state, for its ``load_state_dict``."""


def save_checkpoint(run_dir: Path, *, learned: LearnedState, state: TrainerState, keep: int) -> Path:
    """Write a checkpoint atomically (manifest last) and prune old ones; returns its directory. A disk error is
    RunFilesError naming the checkpoint, and leaves no temporary directory behind."""
    root = run_dir / "checkpoints"
    final = root / f"{PREFIX}{state.update:08d}"
    with writing(final):
        root.mkdir(parents=True, exist_ok=True)
        _write_into_place(final, learned=learned, state=state)
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _write_into_place(final: Path, *, learned: LearnedState, state: TrainerState) -> None:
    with atomic_directory(final) as tmp:
        for name, module_state in learned.modules.items():
            save_file(_arrays(module_state), str(tmp / f"{name}.safetensors"))
        for name, optimizer_state in learned.optimizers.items():
            tensors, meta = _flatten_optimizer(optimizer_state)
            save_file(tensors, str(tmp / f"{name}.safetensors"))
            (tmp / f"{name}.json").write_text(json.dumps(meta))
        (tmp / f"{TRAINER_STATE}.json").write_text(json.dumps(dataclasses.asdict(state)))
        write_manifest(tmp)


def save_file(tensors: dict[str, np.ndarray], filename: str) -> None:
    """One safetensors file, written by Python (so a full disk raises OSError with its errno, not SafetensorError)."""
    with open(filename, "wb") as file:
        file.write(save(tensors))


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    root = run_dir / "checkpoints"
    if not root.is_dir():
        return []
    restore_set_aside(root)  # a crash between the two renames of a re-save: restore the old one
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX))


def load_checkpoint(path: Path) -> Checkpoint:
    """Read a checkpoint: its trainer state, and every module and optimizer file as state dicts, after checking them
    (CheckpointDamaged naming the file and the reason: a manifest mismatch, a cut file, NaN/inf weights, bad counters).

    A ``<name>.safetensors`` with a ``<name>.json`` beside it is an optimizer's, one without is a module's."""
    verify_manifest(path)
    state_file = path / f"{TRAINER_STATE}.json"
    state = TrainerState(**checked_trainer_state(read_json(state_file), state_file.name))
    modules: dict[str, dict[str, torch.Tensor]] = {}
    optimizers: dict[str, dict[str, Any]] = {}
    for file in sorted(path.glob("*.safetensors")):
        arrays = read_checked_tensors(file)
        meta_file = file.with_suffix(".json")
        if meta_file.exists():
            optimizers[file.stem] = _optimizer_state(arrays, read_json(meta_file), meta_file.name)
        else:
            modules[file.stem] = {k: torch.from_numpy(v) for k, v in arrays.items()}
    if not modules:
        raise CheckpointDamaged("*.safetensors", "no module weights in the checkpoint")
    return Checkpoint(trainer_state=state, learned=LearnedState(modules=modules, optimizers=optimizers))


def read_checked_tensors(file: Path) -> dict[str, np.ndarray]:
    """A safetensors file's arrays, checked to be readable and finite (CheckpointDamaged naming the file if not)."""
    try:
        arrays = load(file.read_bytes())
    except SafetensorError as err:
        raise CheckpointDamaged(file.name, f"not a readable safetensors file ({err})") from err
    check_finite(file.name, arrays)
    return arrays


def _optimizer_state(arrays: dict[str, np.ndarray], meta: Any, file: str) -> dict[str, Any]:
    try:
        return _unflatten_optimizer(arrays, meta)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise CheckpointDamaged(file, f"not an optimizer state ({type(err).__name__}: {err})") from err


def _arrays(module_state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().contiguous().numpy() for k, v in module_state.items()}


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
