"""Load a trained policy from a run directory: its config.yaml and one checkpoint's ``model.safetensors``.

Reads what ``learner/run/run_dir.py`` (config.yaml) and ``learner/run/checkpoint.py`` (``checkpoints/update_*/``)
write; nothing is unpickled. The env spec comes from ``envs.registry.env_spec`` (an external env is built
once, in this process, to read it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from torch import nn

from configs.schema import RunConfig
from envs.base import EnvSpec
from envs.registry import env_spec
from learner.run.checkpoint import PREFIX, list_checkpoints, read_checked_tensors
from learner.run.checkpoint_integrity import CheckpointDamaged, verify_manifest
from learner.run.run_dir import RunDirError, read_run_config
from policies.factory import load_state_arrays, make_policy

MODEL_FILE = "model.safetensors"
"""The policy's weights inside a checkpoint directory (PPO's name for its module)."""


class LoadPolicyError(ValueError):
    """A run directory or checkpoint cannot be loaded as asked."""


@dataclass(frozen=True, kw_only=True)
class LoadedPolicy:
    """A trained policy ready to act, with what it was trained on."""

    policy: nn.Module
    """The actor-critic module (``policies.factory.make_policy``), weights loaded, in eval mode, on the CPU."""
    spec: EnvSpec
    """The spec of the env the run trained on."""
    config: RunConfig
    """The run's resolved config (its config.yaml)."""
    update: int
    """The update number of the checkpoint the weights come from."""


def checkpoint_update(path: Path) -> int:
    """The update number in a checkpoint directory's name (``update_00000042`` -> 42)."""
    return int(path.name[len(PREFIX):])


def find_checkpoint(run_dir: Path, checkpoint: int | None) -> Path:
    """The directory of checkpoint ``checkpoint`` (an update number), or the newest one when None."""
    available = list_checkpoints(run_dir)
    if not available:
        raise LoadPolicyError(f"run directory {run_dir} has no checkpoint in {run_dir / 'checkpoints'} "
                              f"(the run stopped before its first one)")
    if checkpoint is None:
        return available[-1]
    by_update = {checkpoint_update(path): path for path in available}
    if checkpoint not in by_update:
        updates = ", ".join(str(u) for u in sorted(by_update))
        raise LoadPolicyError(f"checkpoint {checkpoint} not found in {run_dir / 'checkpoints'}; available: {updates}")
    return by_update[checkpoint]


def load_policy(run_dir: Path | str, checkpoint: int | None = None) -> LoadedPolicy:
    """The policy of ``run_dir`` at checkpoint ``checkpoint`` (an update number; None: the newest).

    Raises ``LoadPolicyError`` for a missing run directory or config.yaml, a run without checkpoints, an absent
    checkpoint (naming the available ones), a checkpoint without ``model.safetensors``, a damaged one (its manifest
    does not match its files, or its weights are cut or not finite: naming the file, and the other checkpoints), or
    a COMA run.
    """
    run_dir = Path(run_dir)
    try:
        config = read_run_config(run_dir)
    except RunDirError as err:
        raise LoadPolicyError(str(err)) from err
    if config.trainer.algorithm == "coma":
        raise LoadPolicyError(f"run {run_dir} trained COMA (trainer.algorithm coma): its team actors are in each "
                              f"checkpoint's actors.safetensors, not a {MODEL_FILE} policy; score it with "
                              f"python -m ops.experiments.coma_spread")
    path = find_checkpoint(run_dir, checkpoint)
    weights = path / MODEL_FILE
    if not weights.is_file():
        raise LoadPolicyError(f"checkpoint {path} has no {MODEL_FILE}")
    try:
        verify_manifest(path)
        arrays = read_checked_tensors(weights)
    except CheckpointDamaged as err:
        others = ", ".join(str(checkpoint_update(p)) for p in list_checkpoints(run_dir) if p != path) or "none"
        raise LoadPolicyError(f"checkpoint {path} is damaged: {err}; pick another with --checkpoint N "
                              f"(the others: {others})") from err
    spec = env_spec(config.env)
    policy = make_policy(spec, config.model)
    load_state_arrays(policy, arrays)
    policy.eval()
    return LoadedPolicy(policy=policy, spec=spec, config=config, update=checkpoint_update(path))
