"""Benchmark: what a new env layout costs the row assembler: compiling at first use, and each recording call.

For each of a few distinct layouts (observation shape and dtype, recurrent state, masks, action vectors) a fresh
process builds a ``RowAssembler`` and times ``warm_up`` (what an actor host does before its first step), first with an
empty numba cache (``cache: cold``, as on a new machine), then again in a second process on the cache the first one
left (``cache: warm``). Then, in that second process, CPU-us per ``add_staged`` call (the host's recording call) at 1
agent and at ``--agents`` agents, the best of ``--rounds`` rounds. Prints one JSON object per layout and cache state.
Usage: .venv/bin/python -m ops.bench.assembler_layouts [--agents 252] [--calls 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ops.benchlib import emit, run_stoppable

REPO = Path(__file__).resolve().parents[2]
LAYOUTS = (
    {"name": "cartpole-like", "obs_shape": (4,), "obs_dtype": "float32"},
    {"name": "gridworld", "obs_shape": (6, 11, 11), "obs_dtype": "uint8"},
    {"name": "recurrent, masked", "obs_shape": (3,), "obs_dtype": "float64", "state_size": 8, "mask_size": 5},
    {"name": "action vectors", "obs_shape": (5,), "obs_dtype": "int16", "action_shape": (2,)},
)
"""Distinct layouts, in the order a process meets them."""
HORIZON = 65


def call_us(assembler, agents: int, calls: int, rounds: int) -> float:
    """Best-of-rounds CPU-us per ``add_staged`` call for ``agents`` agents (rows shipped and released between)."""
    staged = assembler.stage(agents)
    ids = np.arange(agents, dtype=np.int64)
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(calls):
            assembler.add_staged(staged, ids, 0)
            if not assembler.can_accept(agents):
                assembler.release(assembler.pop_full(assembler.full_rows()))
        best = min(best, (time.process_time() - started) / calls * 1e6)
    return best


def child(agents: int, calls: int, rounds: int, timed_calls: bool) -> None:
    """In this process: each layout's warm-up seconds (and, when ``timed_calls``, its call costs), one JSON line
    each."""
    from actors.assembler import RowAssembler

    for index, spec in enumerate(LAYOUTS):
        shape = {key: value for key, value in spec.items() if key != "name"}
        assembler = RowAssembler(num_agents=agents, num_rows=4 * agents, horizon=HORIZON, **shape)
        started = time.perf_counter()
        assembler.warm_up()
        record = {"layout": spec["name"], "layout_index": index, "warm_up_s": round(time.perf_counter() - started, 3)}
        if timed_calls:
            record["us_per_call_1_agent"] = round(call_us(assembler, 1, calls, rounds), 2)
            record[f"us_per_call_{agents}_agents"] = round(call_us(assembler, agents, calls, rounds), 2)
        print(json.dumps(record), flush=True)


def run_child(cache_dir: str, args: argparse.Namespace, timed_calls: bool) -> list[dict]:
    command = [sys.executable, "-m", "ops.bench.assembler_layouts", "--child", "--agents", str(args.agents),
               "--calls", str(args.calls), "--rounds", str(args.rounds)] + (["--timed-calls"] if timed_calls else [])
    done = subprocess.run(command, cwd=REPO, env={**os.environ, "NUMBA_CACHE_DIR": cache_dir}, capture_output=True,
                          text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"assembler_layouts: the measuring process failed: {done.stderr[-2000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=252, help="agents per timed call (a gridworld host's batch)")
    parser.add_argument("--calls", type=int, default=2000, help="add_staged calls per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of calls; the best is reported")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--timed-calls", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    for name in ("agents", "calls", "rounds"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: 1 at least, got {getattr(args, name)}")
    if args.child:
        child(args.agents, args.calls, args.rounds, args.timed_calls)
        return
    with tempfile.TemporaryDirectory(prefix="sluice_numba_cache_") as cache_dir:
        for cache, timed_calls in (("cold", False), ("warm", True)):
            for record in run_child(cache_dir, args, timed_calls):
                emit({"bench": "assembler_layouts", "cache": cache, **record})


if __name__ == "__main__":
    run_stoppable(main)
