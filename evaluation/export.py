"""`python -m evaluation.export`: write a run's policy as a deterministic TorchScript or ONNX file for deployment.

    python -m evaluation.export --run-dir runs/cartpole-... [--checkpoint N] --format torchscript|onnx [--out FILE]

Loads ``config.yaml`` and a checkpoint's ``model.safetensors`` (``evaluation.load_policy``; the newest unless
``--checkpoint N`` names an update) and writes a file that maps a batch of observations to actions, the way
``python -m evaluation.evaluate --deterministic`` acts (``evaluation.episode_runner``): the policy's ``step``, then
``ActionDistribution.mode`` under the action mask, i.e. the argmax of the masked logits per component for the
discrete kinds (int32), and for box the Gaussian mean clipped to the action bounds, which is what the env receives
(the env adapter clips; float32). Whatever the policy carries goes in: every encoder (mlp, cnn, tokens) and the
``model.obs_norm`` statistics, which are buffers of the module.

Inputs, in this order (batch = agents, any size >= 1):

* ``obs`` [batch, *obs_shape] in the env's obs dtype;
* ``action_mask`` [batch, mask_size] uint8 (1 = legal), only when the env writes masks; all ones is no restriction
  (a component whose mask allows nothing is left unmasked, as in training);
* ``state`` [batch, state_size] float32, only for a recurrent (``model.core: lstm``) policy: zeros at an episode's
  first step, then the ``next_state`` the previous step returned.

Outputs: ``actions`` [batch, *action_shape], then ``next_state`` for a recurrent policy. A JSON sidecar next to the
file (``FILE.json``) records this contract: input and output names, dtypes and shapes, the action space and where
the weights came from. Before anything is reported the written file is run on random inputs and compared with the
checkpoint's policy (ONNX: when onnxruntime is installed; otherwise the check is skipped, and the output says so).

The default ``--out`` is ``<run-dir>/export/policy_update_<N>.pt`` (``.onnx``). ONNX needs the ``onnx`` and
``onnxscript`` packages (the ``export`` extra). COMA runs (team actors, ``actors.safetensors``) cannot be exported.
Usage and input problems print one line ``python -m evaluation.export: error: <message>`` on stderr and exit with
status 2; an export that fails (a missing package, the exporter's error, a written file that disagrees with the
policy, a file that cannot be written) exits with status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import math
import sys
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from envs.base import EnvSpec
from envs.errors import EnvConfigError
from envs.obs_layout import random_flat_obs
from evaluation.load_policy import MODEL_FILE, LoadedPolicy, LoadPolicyError, load_policy
from learner.run.atomic import atomic_write_bytes, atomic_write_text
from learner.run.run_dir import RunDirError, read_run_config
from policies.encoders import encoder_kind

PROG = "python -m evaluation.export"
FORMATS = {"torchscript": ".pt", "onnx": ".onnx"}
"""``--format`` choices and the extension of their default ``--out``."""
ONNX_OPSET = 18
"""ONNX opset of the exported graph (onnxruntime 1.14 and later run it)."""
EXAMPLE_BATCH = 2
"""Batch size of the example inputs the exporters trace (the batch dimension stays dynamic)."""
CHECK_BATCHES = (1, 5, 64)
"""Batch sizes of the random inputs the written file is checked on."""
TOLERANCE = 1e-5
"""rtol and atol of the box actions and recurrent states in the check (discrete actions must be equal)."""
BATCH = "batch"
"""Name of the dynamic batch dimension in the sidecar's shapes."""


class ExportError(ValueError):
    """A usage or input problem: ``python -m evaluation.export: error: <message>``, exit status 2."""


class ExportFailed(RuntimeError):
    """The export itself failed (a missing package, the exporter, the check, the disk): exit status 1."""


# -- the exported module -----------------------------------------------------------------------------------------

class DeterministicActor(nn.Module):
    """A policy module (``policies.factory.make_policy``) acting deterministically: inputs -> actions (+ state).

    ``act`` is ``evaluation.episode_runner``'s deterministic step; the subclasses only fix the ``forward`` signature
    to the inputs this env and core have, since the exporters need one signature without optional arguments.
    """

    def __init__(self, policy: nn.Module, spec: EnvSpec) -> None:
        super().__init__()
        self.policy = policy
        self.distribution = policy.distribution
        self.recurrent = policy.state_size > 0
        self.masked = spec.mask_size > 0
        self.box = spec.action.kind == "box"
        if self.box:
            self.register_buffer("low", torch.tensor(spec.action.low, dtype=torch.float32))
            self.register_buffer("high", torch.tensor(spec.action.high, dtype=torch.float32))

    def act(self, obs: torch.Tensor, mask: torch.Tensor | None,
            state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Most probable actions [n, *action_shape] (box: the mean clipped to the bounds) and the next state."""
        if self.recurrent:
            params, _, next_state = self.policy.step(obs, state)
        else:
            params, next_state = self.policy(obs)[0], None
        actions = self.distribution.mode(params, mask)
        if self.box:
            actions = torch.minimum(torch.maximum(actions, self.low), self.high)
        return actions, next_state


class _Actor(DeterministicActor):
    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.act(obs, None, None)[0]


class _MaskedActor(DeterministicActor):
    def forward(self, obs: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
        return self.act(obs, action_mask, None)[0]


class _RecurrentActor(DeterministicActor):
    def forward(self, obs: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.act(obs, None, state)


class _MaskedRecurrentActor(DeterministicActor):
    def forward(self, obs: torch.Tensor, action_mask: torch.Tensor,
                state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.act(obs, action_mask, state)


def deterministic_actor(policy: nn.Module, spec: EnvSpec) -> DeterministicActor:
    """``policy`` wrapped to act deterministically, its ``forward`` taking exactly the inputs of ``io_contract``."""
    kind = {(False, False): _Actor, (True, False): _MaskedActor, (False, True): _RecurrentActor,
            (True, True): _MaskedRecurrentActor}[(spec.mask_size > 0, policy.state_size > 0)]
    return kind(policy, spec).eval()


# -- the I/O contract --------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class TensorSpec:
    """One input or output of the exported file."""

    name: str
    dtype: str
    """NumPy dtype name."""
    shape: tuple[int | str, ...]
    """``BATCH`` first, then fixed sizes."""

    def to_json(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


def io_contract(spec: EnvSpec, state_size: int) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The exported file's inputs and outputs, in order, for an env spec and a policy's ``state_size``."""
    inputs = [TensorSpec(name="obs", dtype=spec.obs_dtype, shape=(BATCH, *spec.obs_shape))]
    outputs = [TensorSpec(name="actions", dtype=spec.action.dtype, shape=(BATCH, *spec.action.shape))]
    if spec.mask_size:
        inputs.append(TensorSpec(name="action_mask", dtype="uint8", shape=(BATCH, spec.mask_size)))
    if state_size:
        inputs.append(TensorSpec(name="state", dtype="float32", shape=(BATCH, state_size)))
        outputs.append(TensorSpec(name="next_state", dtype="float32", shape=(BATCH, state_size)))
    return inputs, outputs


def random_inputs(spec: EnvSpec, state_size: int, batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Valid random inputs of the exported file (``io_contract``'s names): observations in the env's dtype (token rows
    with real ids, about half of them padding; structured ones leaf by leaf; other integers sparse), masks with
    random legal actions, states N(0, 0.25)."""
    dtype = np.dtype(spec.obs_dtype)
    shape = (batch, *spec.obs_shape)
    if spec.obs_leaves:  # a structured observation: each leaf valid on its own (discrete values in range)
        obs = random_flat_obs(spec, batch, rng)
    elif spec.tokens is not None:
        info = np.iinfo(dtype)
        obs = rng.integers(max(info.min, 0), min(info.max, 255) + 1, size=shape).astype(dtype)
        real = rng.random(shape[:-1]) < 0.5
        obs[..., 0] = np.where(real, rng.integers(0, spec.tokens.num_locations, size=shape[:-1]),
                               spec.tokens.pad_value)
        obs[..., 1] = np.where(real, rng.integers(0, spec.tokens.num_features, size=shape[:-1]), obs[..., 1])
    elif dtype == np.bool_:
        obs = rng.random(shape) < 0.5
    elif dtype.kind in "iu":  # sparse, each observation its own density: images of varied content
        info = np.iinfo(dtype)
        values = rng.integers(max(info.min, 0), min(info.max, 255) + 1, size=shape)
        density = rng.random((batch,) + (1,) * len(spec.obs_shape))
        obs = np.where(rng.random(shape) < density, values, 0).astype(dtype)
    else:
        obs = (2.0 * rng.standard_normal(shape)).astype(dtype)
    inputs = {"obs": obs}
    if spec.mask_size:
        inputs["action_mask"] = (rng.random((batch, spec.mask_size)) < 0.6).astype(np.uint8)
    if state_size:
        inputs["state"] = (0.5 * rng.standard_normal((batch, state_size))).astype(np.float32)
    return inputs


@torch.no_grad()
def reference_outputs(actor: DeterministicActor, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """What the checkpoint's policy, in eager PyTorch, returns for ``inputs`` (the exported file's outputs)."""
    outputs = actor(*(torch.from_numpy(array) for array in inputs.values()))
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    return [tensor.numpy() for tensor in outputs]


# -- writing -----------------------------------------------------------------------------------------------------

def default_out(run_dir: Path, update: int, fmt: str) -> Path:
    """``<run_dir>/export/policy_update_<update><ext>``."""
    return run_dir / "export" / f"policy_update_{update}{FORMATS[fmt]}"


def sidecar_path(out: Path) -> Path:
    """The JSON contract next to an exported file: ``FILE.json``."""
    return out.with_name(out.name + ".json")


@contextlib.contextmanager
def _quiet_exporters() -> Iterator[None]:
    """TorchScript's deprecation warnings, the tracer's and the ONNX exporter's chatter kept off the terminal."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "torch.export", "torch._dynamo", "onnxscript")]
    levels = [logger.level for logger in loggers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for logger in loggers:
            logger.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for logger, level in zip(loggers, levels):
                logger.setLevel(level)


def torchscript_bytes(actor: DeterministicActor, example: tuple[torch.Tensor, ...]) -> bytes:
    """The actor traced (``torch.jit.trace``) and saved as a TorchScript archive."""
    with _quiet_exporters(), torch.no_grad():
        traced = torch.jit.trace(actor, example, check_trace=False)
        buffer = io.BytesIO()
        torch.jit.save(traced, buffer)
    return buffer.getvalue()


def onnx_bytes(actor: DeterministicActor, example: tuple[torch.Tensor, ...], inputs: list[TensorSpec],
               outputs: list[TensorSpec]) -> bytes:
    """The actor exported by ``torch.onnx.export`` (the torch.export-based exporter) as one ONNX file, batch dynamic."""
    try:
        import onnx  # noqa: F401  (the exporter needs both)
        import onnxscript  # noqa: F401
    except ImportError as err:
        raise ExportFailed(f"--format onnx needs the onnx and onnxscript packages ({err}); install them with "
                           f"pip install 'sluice[export]'") from err
    batch = torch.export.Dim(BATCH)
    dynamic = {i.name: {0: batch} for i in inputs}
    with _quiet_exporters():
        program = torch.onnx.export(actor, example, None, input_names=[i.name for i in inputs],
                                    output_names=[o.name for o in outputs], dynamic_shapes=dynamic,
                                    opset_version=ONNX_OPSET, dynamo=True, external_data=False, verbose=False)
    return program.model_proto.SerializeToString()


# -- checking ----------------------------------------------------------------------------------------------------

def run_exported(path: Path, fmt: str, inputs: dict[str, np.ndarray]) -> list[np.ndarray] | None:
    """The written file's outputs for ``inputs`` (TorchScript: ``torch.jit.load``; ONNX: onnxruntime); None when
    onnxruntime is not installed."""
    if fmt == "torchscript":
        with _quiet_exporters(), torch.no_grad():
            module = torch.jit.load(str(path))
            outputs = module(*(torch.from_numpy(array) for array in inputs.values()))
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        return [tensor.numpy() for tensor in outputs]
    try:
        import onnxruntime
    except ImportError:
        return None
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


def disagreement(actor: DeterministicActor, inputs: dict[str, np.ndarray], expected: list[np.ndarray],
                 got: list[np.ndarray], outputs: list[TensorSpec]) -> str | None:
    """Why the exported file's outputs ``got`` differ from the policy's ``expected`` (None: they agree).

    Discrete actions must be equal, except where the policy's own log-probabilities of the two choices are within
    ``TOLERANCE`` (a tie that float rounding breaks either way); box actions and states within ``TOLERANCE``.
    """
    for spec, want, have in zip(outputs, expected, got):
        if want.shape != have.shape or want.dtype != have.dtype:
            return f"{spec.name} has shape {have.shape} and dtype {have.dtype}, expected {want.shape} {want.dtype}"
        if spec.dtype == "int32":
            differs = np.argwhere(want != have)
            if len(differs) and not _ties(actor, inputs, want, have):
                return f"{spec.name} differ in {len(differs)} of {want.size} entries (first at {differs[0].tolist()})"
        elif not np.allclose(want, have, rtol=TOLERANCE, atol=TOLERANCE):
            return f"{spec.name} differ by up to {float(np.max(np.abs(want - have))):.3g}"
    return None


@torch.no_grad()
def _ties(actor: DeterministicActor, inputs: dict[str, np.ndarray], want: np.ndarray, have: np.ndarray) -> bool:
    """Whether every differing discrete choice is a near-tie of the policy's masked log-probabilities."""
    obs = torch.from_numpy(inputs["obs"])
    mask = torch.from_numpy(inputs["action_mask"]) if "action_mask" in inputs else None
    if actor.recurrent:
        params = actor.policy.step(obs, torch.from_numpy(inputs["state"]))[0]
    else:
        params = actor.policy(obs)[0]
    want, have = want.reshape(len(want), -1), have.reshape(len(have), -1)
    for component, logp in enumerate(actor.distribution.component_log_probs(params, mask)):
        a = torch.from_numpy(want[:, component]).long().unsqueeze(-1)
        b = torch.from_numpy(have[:, component]).long().unsqueeze(-1)
        if not ((0 <= a) & (a < logp.shape[-1]) & (0 <= b) & (b < logp.shape[-1])).all():
            return False
        if (logp.gather(-1, a) - logp.gather(-1, b)).abs().max() > TOLERANCE:
            return False
    return True


# -- the command -------------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class ExportResult:
    out: Path
    sidecar: Path
    update: int
    checked: bool
    """Whether the written file was run and compared with the policy (False: ONNX without onnxruntime)."""


def export_policy(loaded: LoadedPolicy, fmt: str, out: Path, *, run_dir: Path | None = None,
                  seed: int = 0) -> ExportResult:
    """Write ``loaded``'s deterministic policy as ``fmt`` to ``out`` and its contract to ``FILE.json``, then check the
    written file against the policy on random inputs (``CHECK_BATCHES``); ExportFailed when anything fails."""
    if fmt not in FORMATS:
        raise ExportError(f"--format {fmt!r} is not supported; allowed: {', '.join(FORMATS)}")
    spec, policy = loaded.spec, loaded.policy
    actor = deterministic_actor(policy, spec)
    inputs, outputs = io_contract(spec, policy.state_size)
    rng = np.random.default_rng(seed)
    example = tuple(torch.from_numpy(a) for a in random_inputs(spec, policy.state_size, EXAMPLE_BATCH, rng).values())
    try:
        data = torchscript_bytes(actor, example) if fmt == "torchscript" else onnx_bytes(actor, example, inputs,
                                                                                          outputs)
    except ExportFailed:
        raise
    except Exception as err:  # the exporters raise many kinds; all mean this policy could not be exported
        raise ExportFailed(f"{fmt} export failed: {_first_line(err)}") from err
    sidecar = sidecar_path(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(out, data)
    except OSError as err:
        raise ExportFailed(f"cannot write {out}: {err.strerror or err}") from err
    checked = True
    for batch in CHECK_BATCHES:
        sample = random_inputs(spec, policy.state_size, batch, rng)
        try:
            got = run_exported(out, fmt, sample)
        except Exception as err:
            raise ExportFailed(f"the written {out} does not run: {_first_line(err)}") from err
        if got is None:
            checked = False
            break
        problem = disagreement(actor, sample, reference_outputs(actor, sample), got, outputs)
        if problem is not None:
            raise ExportFailed(f"the written {out} disagrees with the checkpoint's policy on a batch of {batch}: "
                               f"{problem}")
    contract = sidecar_json(loaded, fmt, out, inputs, outputs, run_dir=run_dir, checked=checked)
    try:
        atomic_write_text(sidecar, json.dumps(contract, indent=2) + "\n")
    except OSError as err:
        raise ExportFailed(f"cannot write {sidecar}: {err.strerror or err}") from err
    return ExportResult(out=out, sidecar=sidecar, update=loaded.update, checked=checked)


def sidecar_json(loaded: LoadedPolicy, fmt: str, out: Path, inputs: list[TensorSpec], outputs: list[TensorSpec], *,
                 run_dir: Path | None, checked: bool) -> dict:
    """The exported file's contract (written to ``FILE.json``)."""
    spec, model = loaded.spec, loaded.config.model
    action: dict = {"kind": spec.action.kind, "shape": list(spec.action.shape), "dtype": spec.action.dtype}
    if spec.action.kind == "box":
        action |= {"low": [_finite_or_text(x) for x in spec.action.low],
                   "high": [_finite_or_text(x) for x in spec.action.high],
                   "actions": "the Gaussian mean clipped to [low, high] (what the env receives)"}
    else:
        action |= {"nvec": list(spec.action.nvec),
                   "actions": "per component, the argmax of the logits with illegal actions masked"}
    contract = {
        "format": fmt,
        "file": out.name,
        "inputs": [i.to_json() for i in inputs],
        "outputs": [o.to_json() for o in outputs],
        "action_space": action,
        "deterministic": True,
        "source": {"run_dir": None if run_dir is None else str(run_dir), "update": loaded.update,
                   "weights": MODEL_FILE, "env": loaded.config.env.name, "num_agents": spec.num_agents,
                   "core": model.core, "encoder": encoder_kind(spec, model), "obs_norm": model.obs_norm},
        "checked": checked,
    }
    if spec.obs_leaves:
        contract["observation_leaves"] = [
            {"name": leaf.name, "kind": leaf.kind, "shape": list(leaf.shape), "dtype": leaf.dtype,
             "offset": leaf.offset, "size": leaf.size, "nvec": list(leaf.nvec), "start": list(leaf.start)}
            for leaf in spec.obs_leaves]  # obs is the flat row envs.obs_layout.flatten_obs writes (discrete: - start)
    if spec.mask_size:
        contract["action_mask"] = ("uint8, 1 = legal, one block of nvec[i] flags per component; all ones = no "
                                   "restriction; a component with no legal action is left unmasked")
    if loaded.policy.state_size:
        contract["state"] = ("LSTM [h, c]: pass zeros at an episode's first step, then the next_state the previous "
                             "step returned for that agent")
    if fmt == "onnx":
        contract["opset"] = ONNX_OPSET
    return contract


def _finite_or_text(value: float) -> float | str:
    """A bound for JSON: the number, or "inf" / "-inf"."""
    return value if math.isfinite(value) else ("inf" if value > 0 else "-inf")


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = argparse.ArgumentParser(prog=prog, description="Write a run's policy as a deterministic TorchScript or "
                                     "ONNX file (observations -> actions) with a JSON sidecar of its inputs and "
                                     "outputs.")
    parser.add_argument("--run-dir", type=Path, required=True, help="run directory (holds config.yaml, checkpoints/)")
    parser.add_argument("--checkpoint", type=int, default=None,
                        help="update number of the checkpoint to export (default: the newest)")
    parser.add_argument("--format", required=True, choices=tuple(FORMATS), help="file format")
    parser.add_argument("--out", type=Path, default=None,
                        help="file to write (default: <run-dir>/export/policy_update_<N>.pt or .onnx); its contract "
                             "goes to FILE.json")
    return parser


def main(argv: Sequence[str] | None = None, *, prog: str = PROG) -> int:
    """Export; 0 on success, 2 on a usage or input error, 1 when the export fails (one line on stderr)."""
    args = build_parser(prog).parse_args(argv)
    try:
        result = export(args)
    except (ExportError, LoadPolicyError, EnvConfigError) as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    except ExportFailed as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 1
    check = ("checked against the checkpoint's policy on random inputs" if result.checked
             else "not checked: onnxruntime is not installed")
    print(f"{prog}: wrote {result.out} ({args.format}, update {result.update}; {check}) and {result.sidecar}")
    return 0


def export(args: argparse.Namespace) -> ExportResult:
    """Everything ``main`` does, raising ``ExportError`` / ``LoadPolicyError`` for bad input, ``ExportFailed``."""
    if args.format not in FORMATS:
        raise ExportError(f"--format {args.format!r} is not supported; allowed: {', '.join(FORMATS)}")
    try:
        config = read_run_config(args.run_dir)
    except RunDirError as err:
        raise ExportError(str(err)) from err
    if config.trainer.algorithm == "coma":
        raise ExportError(f"run {args.run_dir} trained COMA (trainer.algorithm coma): export supports PPO policies "
                          f"({MODEL_FILE}) only, not COMA's team actors (actors.safetensors)")
    loaded = load_policy(args.run_dir, args.checkpoint)
    out = args.out if args.out is not None else default_out(args.run_dir, loaded.update, args.format)
    if out.is_dir():
        raise ExportError(f"--out {out} is a directory; name the file to write")
    return export_policy(loaded, args.format, out, run_dir=args.run_dir)


if __name__ == "__main__":
    sys.exit(main())
