"""Benchmark: seconds per PPO update of the learner on a synthetic batch (no sockets, no actors).

Builds a batch the shape a config implies (random observations, behaviour log-probs from the policy
itself), then times ``ppo_update`` with and without ``torch.compile``. Prints one JSON object per
variant. ``--encoder mlp --encoder cnn`` (or ``--encoder all``) times each observation encoder in turn
(model.encoder; ``all``: every one the env can take). ``--ranks K`` (repeatable) times the data-parallel update
of K learner ranks on CPU (issue 15) and adds "ranks", "samples_per_s" (whole-batch transitions per second) and
"rank_threads": K = 1 is the single-process update; K > 1 starts K real gloo processes
(``python -m ops.bench.rank_update_worker``), each timing its share of the batch, without the compile variant.
Usage: .venv/bin/python -m ops.bench.learner_update [--config configs/cartpole.yaml] [--device cpu|cuda]
[--updates 20] [--encoder auto|mlp|cnn|tokens|all ...] [--ranks K ...] [--no-compile] [--autocast none|bf16 ...]
[--peak-tflops T] [--set trainer.key=value ...]. Every record has "update_gflop", one update's FLOPs (forward and
backward matmuls and convolutions, torch's FlopCounterMode); with ``--peak-tflops`` also the compute floor.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from configs.loader import ConfigError, load_config
from configs.plan import PlanError
from configs.rank_plan import make_rank_plan
from configs.schema import AUTOCAST_MODES
from envs.base import EnvSpec
from envs.registry import env_spec
from envs.rows import row_layout
from learner.ppo.algorithm import make_optimizer
from learner.ppo.losses import minibatch_losses
from learner.ppo.schedules import schedule_for
from learner.ppo.update import ppo_update
from learner.update.batch import BatchBuffers, RowBatch, to_batch
from learner.update.reducer import SINGLE_PROCESS, Reducer
from ops.benchlib import run_stoppable
from policies.encoders import encoder_kind
from policies.factory import make_policy

REPO = Path(__file__).resolve().parents[2]
RANK_WORKER = "ops.bench.rank_update_worker"
"""The module one rank of a ``--ranks K`` (K > 1) timing runs (``python -m``, from the repository root)."""


def synthetic_batch(policy: torch.nn.Module, spec: EnvSpec, segments: int, horizon: int, device: torch.device,
                    seed: int) -> RowBatch:
    """Random rows whose behaviour log-probs and values come from ``policy`` (ratios near 1)."""
    gen = torch.Generator().manual_seed(seed)
    if np.dtype(spec.obs_dtype) == np.uint8:
        obs = torch.randint(0, 256, (segments, horizon, *spec.obs_shape), generator=gen, dtype=torch.uint8)
    else:
        obs = torch.randn((segments, horizon, *spec.obs_shape), generator=gen)
    with torch.no_grad():
        logits, values = policy.to("cpu").forward_rows(obs, torch.zeros(segments, horizon),
                                                       torch.zeros(segments, policy.state_size))
    actions = torch.distributions.Categorical(logits=logits).sample()
    logprobs = torch.log_softmax(logits, -1).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    dones = (torch.rand((segments, horizon), generator=gen) < 0.02).float()
    policy.to(device)
    buffers = BatchBuffers.allocate(row_layout(spec, horizon=horizon, state_size=policy.state_size), segments)
    arrays = buffers.arrays  # every field is set below
    for name, tensor in (("obs", obs), ("actions", actions), ("logprobs", logprobs), ("values", values),
                         ("rewards", torch.rand((segments, horizon), generator=gen)), ("dones", dones)):
        arrays[name][:] = tensor.numpy()
    for name in ("action_masks", "bootstrap", "versions", "states"):
        arrays[name][:] = 0
    return to_batch(buffers, device)


def update_flop(policy: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: RowBatch, *, trainer, plan,
                reducer: Reducer) -> int:
    """Floating-point operations of one uncompiled PPO update (forward and backward passes, torch's FlopCounterMode:
    matmuls and convolutions), the work a compute floor divides by the device's peak."""
    with FlopCounterMode(display=False) as counter:
        ppo_update(policy, optimizer, batch, trainer=trainer, plan=plan, schedule=schedule_for(trainer, 0, 100),
                   generator=torch.Generator(device=batch.obs.device).manual_seed(0), reducer=reducer,
                   autocast=trainer.autocast)
    return counter.get_total_flops()


def time_updates(config, device: torch.device, updates: int, compiled: bool, *, reducer: Reducer = SINGLE_PROCESS,
                 rank: int = 0, count_flop: bool = True) -> dict:
    """Time ``updates`` PPO updates after two warm-up ones, then count one update's FLOPs (``count_flop``). With a
    process group's ``reducer`` this is rank ``rank`` of ``reducer.world_size``: the same policy on every rank, its
    own synthetic share of the batch (seeded by rank), and every rank starting each update together."""
    torch.manual_seed(config.run.seed)
    trainer = config.trainer
    spec = env_spec(config.env)
    rank_plan = make_rank_plan(trainer, num_agents=config.env.num_agents, world_size=reducer.world_size)
    plan = rank_plan.rank
    policy = make_policy(spec, config.model)
    batch = synthetic_batch(policy, spec, plan.segments, trainer.bptt_horizon + 1, device, config.run.seed + rank)
    optimizer = make_optimizer(policy, trainer)
    loss_fn = torch.compile(minibatch_losses, mode=trainer.compile_mode) if compiled else minibatch_losses
    generator = torch.Generator(device=device).manual_seed(rank)
    times, first_s = [], 0.0
    for update in range(updates + 2):  # the first two are warm-up (compilation, allocator)
        reducer.sum(torch.zeros(1))  # a barrier: the ranks start the update together (the identity for one process)
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        ppo_update(policy, optimizer, batch, trainer=trainer, plan=plan,
                   schedule=schedule_for(trainer, update, 100), generator=generator, loss_fn=loss_fn,
                   reducer=reducer, autocast=trainer.autocast)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if update == 0:
            first_s = time.perf_counter() - start
        if update >= 2:
            times.append(time.perf_counter() - start)
    median = statistics.median(times)
    flop = update_flop(policy, optimizer, batch, trainer=trainer, plan=plan, reducer=reducer) if count_flop else None
    return {"benchmark": "learner_update", "compile": compiled, "autocast": trainer.autocast, "device": str(device),
            "update_gflop": None if flop is None else round(flop / 1e9, 3),
            "encoder": encoder_kind(spec, config.model), "parameters": sum(p.numel() for p in policy.parameters()),
            "segments": rank_plan.run.segments, "horizon": trainer.bptt_horizon,
            "gradient_steps": plan.gradient_updates_per_batch,
            "first_update_s": round(first_s, 2), "update_s_median": round(median, 4), "update_s_min": round(min(times), 4),
            "transitions_per_s": round(trainer.batch_size / median),
            "machine": f"{platform.node()} {os.cpu_count()} cores {platform.machine()}",
            "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
            "torch": torch.__version__, "torch_threads": torch.get_num_threads()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/cartpole.yaml")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--updates", type=int, default=20)
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile variant")
    parser.add_argument("--encoder", action="append", default=[], dest="encoders",
                        help="model.encoder to time (repeatable; 'all': every encoder the env can take; "
                             "default: the config's)")
    parser.add_argument("--ranks", action="append", type=int, default=[],
                        help="learner ranks K to time on CPU (repeatable; K > 1: K gloo processes, no compile variant)")
    parser.add_argument("--autocast", action="append", default=[], choices=AUTOCAST_MODES,
                        help="trainer.autocast to time (repeatable; default: the config's)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="the device's peak TFLOP/s for the update's dtype: adds compute_floor_s (update FLOPs / "
                             "peak) and floor_ratio (floor / median update time)")
    parser.add_argument("--rank-timeout-s", type=float, default=600.0,
                        help="longest a K > 1 timing (and any one of its collectives) may take before every rank is "
                             "killed")
    args = parser.parse_args()
    config = load_config(args.config, args.overrides)
    for ranks in args.ranks:
        if ranks > 1 and args.device != "cpu":
            parser.error(f"--ranks {ranks} times gloo processes on CPU only, not --device {args.device}")
        try:
            make_rank_plan(config.trainer, num_agents=config.env.num_agents, world_size=ranks)
        except PlanError as error:
            parser.error(f"--ranks {ranks}: {error}")
    torch.set_num_threads(config.run.torch_threads)
    device = torch.device(args.device)
    variants = [False] if args.no_compile else [False, True]
    for encoder in encoders_to_time(config, args.encoders):
        encoded = replace(config, model=replace(config.model, encoder=encoder))
        for ranks in args.ranks or [None]:
            if ranks is not None and ranks > 1:
                record = time_ranks(args.config, args.overrides, encoder=encoder, ranks=ranks, updates=args.updates,
                                    timeout_s=args.rank_timeout_s)
                print(json.dumps(record), flush=True)
                continue
            if ranks == 1:  # one rank gets every core, as K ranks share them (cpu_count // K threads each)
                torch.set_num_threads(os.cpu_count() or 1)
            for autocast in args.autocast or [config.trainer.autocast]:
                cast = replace(encoded, trainer=replace(encoded.trainer, autocast=autocast))
                for compiled in variants:
                    record = with_floor(time_updates(cast, device, args.updates, compiled), args.peak_tflops)
                    print(json.dumps(record if ranks is None else with_ranks(record, ranks=1)), flush=True)


def with_floor(record: dict, peak_tflops: float | None) -> dict:
    """The record with its compute floor: the update's FLOPs at the device's peak, and that floor over the median."""
    if peak_tflops is None or record["update_gflop"] is None:
        return record
    floor_s = record["update_gflop"] / (peak_tflops * 1e3)
    return {**record, "peak_tflops": peak_tflops, "compute_floor_s": round(floor_s, 6),
            "floor_ratio": round(floor_s / record["update_s_median"], 4)}


def with_ranks(record: dict, *, ranks: int) -> dict:
    """A timing record of ``ranks`` learner ranks with the fields that compare rank counts: whole-batch transitions
    per second of the median update, the torch threads of one rank and the rows of one rank."""
    return {**record, "ranks": ranks, "samples_per_s": record["transitions_per_s"],
            "rank_threads": record["torch_threads"], "rank_segments": record["segments"] // ranks}


def time_ranks(config_path: str, overrides: list[str], *, encoder: str, ranks: int, updates: int,
               timeout_s: float) -> dict:
    """Rank 0's record of ``ranks`` rank processes (RANK_WORKER) timing the data-parallel update together. A rank
    that fails, or a run past ``timeout_s``, kills every rank and exits with their stderr."""
    with tempfile.TemporaryDirectory(prefix="sluice-bench-ranks-") as directory:
        folder = Path(directory)
        threads = max(1, (os.cpu_count() or 1) // ranks)
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        settings = [arg for override in overrides for arg in ("--set", override)]
        processes = []
        try:
            for rank in range(ranks):
                command = [sys.executable, "-m", RANK_WORKER, "--rank", str(rank), "--world-size", str(ranks),
                           "--init-method", f"file://{folder / 'rendezvous'}", "--timeout-s", str(timeout_s),
                           "--threads", str(threads), "--config", config_path, "--encoder", encoder,
                           "--updates", str(updates), *settings]
                with open(folder / f"rank{rank}.out", "w") as out, open(folder / f"rank{rank}.err", "w") as err:
                    processes.append(subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=err))
            failure = wait_for_ranks(processes, timeout_s)
        finally:
            for process in processes:
                if process.poll() is None:
                    process.kill()
                process.wait()
        if failure is not None:
            errors = "\n".join(f"rank {rank} stderr:\n{(folder / f'rank{rank}.err').read_text()[-2000:]}"
                               for rank in range(len(processes)))
            raise SystemExit(f"learner_update --ranks {ranks}: {failure}; every rank was stopped\n{errors}")
        return json.loads((folder / "rank0.out").read_text())


def wait_for_ranks(processes: list[subprocess.Popen], timeout_s: float) -> str | None:
    """Wait until every process exited 0 (None), one exited otherwise, or ``timeout_s`` passed (what went wrong)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        statuses = [process.poll() for process in processes]
        failed = [f"rank {rank} exited with status {status}" for rank, status in enumerate(statuses)
                  if status not in (None, 0)]
        if failed:
            return ", ".join(failed)
        if all(status == 0 for status in statuses):
            return None
        time.sleep(0.1)
    return f"the ranks did not all finish within {timeout_s:g} s"


def encoders_to_time(config, asked: list[str]) -> list[str]:
    """The model.encoder values to time: as asked, 'all' expanded to every encoder this env can take."""
    if not asked:
        return [config.model.encoder]
    if "all" not in asked:
        return asked
    spec = env_spec(config.env)
    usable = []
    for encoder in ("mlp", "cnn", "tokens"):
        try:
            encoder_kind(spec, replace(config.model, encoder=encoder))
        except ConfigError:
            continue
        usable.append(encoder)
    return usable


if __name__ == "__main__":
    run_stoppable(main)
