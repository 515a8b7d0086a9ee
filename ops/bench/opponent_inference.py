"""Benchmark: an actor host's opponent actions in self-play, one forward pass per snapshot against one batched pass.

Builds ``--snapshots`` random-weight policies of a config's model (default: ``selfplay_connect4``, the CNN encoder),
and times, per step, (a) each snapshot's own ``Inference.decide`` on its rows (how actor hosts ran opponents before
``actors/opponent_batch.py``) and (b) ``SnapshotBatch.act`` on all of them (vmap over the stacked weights), for
each ``--rows`` (rows per snapshot). Also times (c) the batched pass when the step's set of snapshots differs from
the stacked one (a subset taken by index) and (d) restacking the weights. Best of ``--repeats`` x ``--steps``.
One thread, as an actor host runs.

Usage: .venv/bin/python -m ops.bench.opponent_inference [--config selfplay_connect4] [--snapshots 8]
       [--rows 8 16 32] [--steps 300] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import torch

from actors.inference import Inference
from actors.opponent_batch import SnapshotBatch
from configs.loader import load_config, resolve_config_path
from envs.registry import env_spec
from ops.benchlib import emit


def best_ms(step: Callable[[], object], *, steps: int, repeats: int) -> float:
    """The fastest mean time of ``step`` in milliseconds over ``repeats`` runs of ``steps`` calls."""
    step()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(steps):
            step()
        times.append((time.perf_counter() - started) / steps)
    return 1e3 * min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="selfplay_connect4")
    parser.add_argument("--snapshots", type=int, default=8, help="distinct snapshots one step plays")
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 16, 32], help="rows per snapshot")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = load_config(resolve_config_path(args.config))
    spec = env_spec(config.env)
    policies = [Inference(spec, config.model, seed=k) for k in range(args.snapshots + 1)]
    rng = np.random.default_rng(0)
    for rows in args.rows:
        obs = [(rng.random((rows, *spec.obs_shape)) < 0.3).astype(spec.obs_dtype) * 255
               for _ in range(args.snapshots)]
        masks = [np.ones((rows, spec.mask_size), dtype=np.uint8) for _ in range(args.snapshots)]
        states = np.zeros((rows, 0), dtype=np.float32)
        in_use = {f"s{k}": p.policy for k, p in enumerate(policies)}
        chosen = list(in_use)[:args.snapshots]
        batch = SnapshotBatch(policies[0].policy.distribution, seed=0)

        def separate() -> None:
            for policy, o, m in zip(policies, obs, masks):
                policy.decide(o, states, m)

        all_in_use = dict(list(in_use.items())[:args.snapshots])
        other = dict(list(in_use.items())[1:])
        flip = [False]

        def restacking() -> None:
            flip[0] = not flip[0]
            stacked = other if flip[0] else all_in_use
            batch.act(stacked, list(stacked), obs, masks)

        record = {"bench": "opponent_inference", "config": args.config, "snapshots": args.snapshots, "rows": rows,
                  "separate_ms": round(best_ms(separate, steps=args.steps, repeats=args.repeats), 3),
                  "batched_ms": round(best_ms(lambda: batch.act(all_in_use, chosen, obs, masks), steps=args.steps,
                                              repeats=args.repeats), 3),
                  "batched_subset_ms": round(best_ms(lambda: batch.act(in_use, chosen, obs, masks),
                                                     steps=args.steps, repeats=args.repeats), 3),
                  "batched_restacking_ms": round(best_ms(restacking, steps=args.steps, repeats=args.repeats), 3)}
        record["speedup"] = round(record["separate_ms"] / record["batched_ms"], 2)
        emit(record)


if __name__ == "__main__":
    main()
