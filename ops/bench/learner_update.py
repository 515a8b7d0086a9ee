"""Benchmark: seconds per PPO update of the learner on a synthetic batch (no sockets, no actors).

Builds a batch the shape a config implies (random observations, behaviour log-probs from the policy
itself), then times ``ppo_update`` with and without ``torch.compile``. Prints one JSON object per
variant. ``--encoder mlp --encoder cnn`` (or ``--encoder all``) times each observation encoder in turn
(model.encoder; ``all``: every one the env can take). Usage: .venv/bin/python ops/bench/learner_update.py
[--config configs/cartpole.yaml] [--device cpu|cuda] [--updates 20] [--encoder auto|mlp|cnn|tokens|all ...]
[--set trainer.key=value ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from dataclasses import replace

import numpy as np
import torch

from envs.registry import env_spec
from envs.base import EnvSpec
from configs.loader import ConfigError, load_config
from configs.plan import make_plan
from envs.rows import row_layout
from learner.batch import BatchBuffers, RowBatch, to_batch
from learner.losses import minibatch_losses
from learner.ppo import ppo_update
from learner.ppo_algorithm import make_optimizer
from learner.schedules import schedule_for
from policies.encoders import encoder_kind
from policies.factory import make_policy


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


def time_updates(config, device: torch.device, updates: int, compiled: bool) -> dict:
    torch.manual_seed(config.run.seed)
    trainer = config.trainer
    spec = env_spec(config.env)
    plan = make_plan(trainer, num_agents=config.env.num_agents)
    policy = make_policy(spec, config.model)
    batch = synthetic_batch(policy, spec, plan.segments, trainer.bptt_horizon + 1, device, config.run.seed)
    optimizer = make_optimizer(policy, trainer)
    loss_fn = torch.compile(minibatch_losses, mode=trainer.compile_mode) if compiled else minibatch_losses
    generator = torch.Generator(device=device).manual_seed(0)
    times, first_s = [], 0.0
    for update in range(updates + 2):  # the first two are warm-up (compilation, allocator)
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        ppo_update(policy, optimizer, batch, trainer=trainer, plan=plan,
                   schedule=schedule_for(trainer, update, 100), generator=generator, loss_fn=loss_fn)
        if device.type == "cuda":
            torch.cuda.synchronize()
        if update == 0:
            first_s = time.perf_counter() - start
        if update >= 2:
            times.append(time.perf_counter() - start)
    median = statistics.median(times)
    return {"benchmark": "learner_update", "compile": compiled, "device": str(device),
            "encoder": encoder_kind(spec, config.model), "parameters": sum(p.numel() for p in policy.parameters()),
            "segments": plan.segments, "horizon": trainer.bptt_horizon,
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
    args = parser.parse_args()
    config = load_config(args.config, args.overrides)
    torch.set_num_threads(config.run.torch_threads)
    device = torch.device(args.device)
    variants = [False] if args.no_compile else [False, True]
    for encoder in encoders_to_time(config, args.encoders):
        encoded = replace(config, model=replace(config.model, encoder=encoder))
        for compiled in variants:
            print(json.dumps(time_updates(encoded, device, args.updates, compiled)), flush=True)


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
    main()
