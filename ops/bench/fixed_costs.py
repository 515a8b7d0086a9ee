"""Benchmark: what the actor pipeline costs per env group, per ROWS message and per agent step, from a sweep of group
and message sizes.

Much of the host's and the workers' work is per env group (a wake, a reply, one inference step's Python, the
kernel's dispatch) and much of the host's and the sink's is per message (gather, encode, send, receive, decode),
whatever the group or message holds. This script runs the pipeline of ``ops.bench.pipeline`` (pipeline only, null
policy) at every pair of ``--envs-per-worker`` and ``--message-rows`` sizes, in turn for ``--rounds`` rounds, and
fits, per process kind (host, workers with their env, sink), by least squares over every run:

    cpu_us_per_agent_step = marginal_us_per_agent_step + fixed_us_per_group / agent_steps_per_group
                            + fixed_us_per_message / agent_steps_per_message

``agent_steps_per_group = envs_per_worker / async_factor * num_agents``; ``agent_steps_per_message`` is measured (agent
steps over messages received). Each run's message size is set with ``network.rows_per_message=R`` and
``network.message_bytes=0`` (exactly R rows a message). It prints one JSON record per run (the pipeline's figures) and
one ``fit`` record per env. The fixed parts are what larger groups (``--envs-per-worker``) and larger messages spread
over more agent steps; the marginal part is what no sizing removes.

Usage: .venv/bin/python -m ops.bench.fixed_costs [--envs cartpole grid3] [--envs-per-worker N N ...]
[--message-rows R R ...] [--async-factor 2] [--seconds 5] [--rounds 1] [--workers 2] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse

import numpy as np

from configs.plan import make_plan
from ops.bench.pipeline import ENVS, bench_config, measure_pipeline
from ops.benchlib import emit, run_stoppable
from protocol.message_memory import keep_freed_memory

KINDS = ("host", "workers", "sink")
"""The process kinds whose CPU per agent step is fitted."""
GROUP_SIZES = {"cartpole": (64, 256, 1024), "grid3": (84, 168, 336), "grid24": (8, 16, 32),
               "synthetic20us": (8, 32, 128)}
"""Envs per worker swept when ``--envs-per-worker`` is not given: from the run config's plan (CartPole 64, the
gridworlds 84 and 8) up to where the gridworld's row buffers still fit a small machine's memory comfortably."""
MESSAGE_ROWS = {"cartpole": (32, 512), "grid3": (16, 64), "grid24": (16, 64), "synthetic20us": (16, 128)}
"""Rows per message swept when ``--message-rows`` is not given (the first: about what the run config ships)."""


def fit_costs(steps_per_group: np.ndarray, steps_per_message: np.ndarray, cpu_us_per_agent_step: np.ndarray
              ) -> dict[str, float]:
    """Least-squares ``cpu = marginal + fixed_group / steps_per_group + fixed_message / steps_per_message`` over the
    runs: ``fixed_us_per_group``, ``fixed_us_per_message``, ``marginal_us_per_agent_step`` and ``rms_residual_us``
    (CPU-us per agent step). Needs runs at two group sizes and two message sizes at least."""
    group = np.asarray(steps_per_group, dtype=np.float64)
    message = np.asarray(steps_per_message, dtype=np.float64)
    cpu = np.asarray(cpu_us_per_agent_step, dtype=np.float64)
    if not group.ndim == 1 or not group.shape == message.shape == cpu.shape:
        raise ValueError(f"one figure per run: {group.shape} group sizes, {message.shape} message sizes, "
                         f"{cpu.shape} CPU figures")
    if len(np.unique(group)) < 2 or len(np.unique(message)) < 2:
        raise ValueError("the fit needs runs at two group sizes and two message sizes at least")
    if (group <= 0).any() or (message <= 0).any():
        raise ValueError("group and message sizes must be positive")
    design = np.stack([np.ones_like(group), 1.0 / group, 1.0 / message], axis=1)
    coefficients, *_ = np.linalg.lstsq(design, cpu, rcond=None)
    residual = cpu - design @ coefficients
    marginal, fixed_group, fixed_message = (float(c) for c in coefficients)
    return {"fixed_us_per_group": fixed_group, "fixed_us_per_message": fixed_message,
            "marginal_us_per_agent_step": marginal, "rms_residual_us": float(np.sqrt(np.mean(residual ** 2)))}


def sweep(env: str, args: argparse.Namespace) -> list[dict]:
    """Every run of one env: each pair of sizes in turn, ``args.rounds`` times."""
    runs = []
    for round_number in range(1, args.rounds + 1):
        for envs_per_worker in args.envs_per_worker or GROUP_SIZES[env]:
            for rows in args.message_rows or MESSAGE_ROWS[env]:
                sizing = (f"network.rows_per_message={rows}", "network.message_bytes=0", *args.overrides)
                config = bench_config(env, args.workers, envs_per_worker, args.async_factor, sizing)
                plan = make_plan(config.trainer, num_agents=config.env.num_agents, num_workers=args.workers)
                record = {"bench": "fixed_costs", "env": env, "round": round_number, "workers": args.workers,
                          "envs_per_worker": plan.envs_per_worker, "async_factor": args.async_factor,
                          "agent_steps_per_group": plan.envs_per_worker // args.async_factor * config.env.num_agents,
                          "rows_per_message": rows, "overrides": args.overrides,
                          **measure_pipeline(config, args.workers, args.seconds)}
                record["agent_steps_per_message"] = round(
                    record["pipeline_agent_steps_per_s"] / max(record["messages_per_s"], 1e-9), 1)
                emit(record)
                runs.append(record)
    return runs


def fit_record(env: str, runs: list[dict]) -> dict:
    """The ``fit`` record of one env's runs: the coefficients per process kind, rounded."""
    group = np.array([run["agent_steps_per_group"] for run in runs])
    message = np.array([run["agent_steps_per_message"] for run in runs])
    record: dict = {"bench": "fixed_costs", "env": env, "runs": len(runs),
                    "fit": "cpu_us_per_agent_step = marginal + fixed_group / steps_per_group "
                           "+ fixed_message / steps_per_message",
                    "agent_steps_per_group": sorted({int(s) for s in group}),
                    "rows_per_message": sorted({int(run["rows_per_message"]) for run in runs})}
    for kind in KINDS:
        fitted = fit_costs(group, message, np.array([run[f"cpu_us_per_agent_step_{kind}"] for run in runs]))
        record.update({f"{kind}_{name}": round(value, 3) for name, value in fitted.items()})
    return record


def _two_sizes(parser: argparse.ArgumentParser, flag: str, sizes: list[int] | None) -> None:
    if sizes is not None and (len(set(sizes)) < 2 or min(sizes) <= 0):
        parser.error(f"{flag}: the fit needs two different positive sizes at least, got {sizes}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=["cartpole", "grid3"], choices=list(ENVS))
    parser.add_argument("--envs-per-worker", type=int, nargs="+", default=None,
                        help="the group sizes swept, envs per worker (default: GROUP_SIZES)")
    parser.add_argument("--message-rows", type=int, nargs="+", default=None,
                        help="the message sizes swept, rows per message (default: MESSAGE_ROWS)")
    parser.add_argument("--async-factor", type=int, default=2, help="env groups per worker (2: double buffering)")
    parser.add_argument("--workers", type=int, default=2, help="env worker processes")
    parser.add_argument("--seconds", type=float, default=5.0, help="measurement window of each run")
    parser.add_argument("--rounds", type=int, default=1, help="times the sizes are measured in turn")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override after the sweep's sizing (e.g. network.send_queue_messages=4)")
    args = parser.parse_args()
    _two_sizes(parser, "--envs-per-worker", args.envs_per_worker)
    _two_sizes(parser, "--message-rows", args.message_rows)
    keep_freed_memory()  # the sink decodes what the learner's ingest would, tuned as the learner is
    for env in args.envs:
        emit(fit_record(env, sweep(env, args)))


if __name__ == "__main__":
    run_stoppable(main)
