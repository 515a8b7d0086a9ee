"""Benchmark: many actor hosts against one learner on this machine.

A real learner (``python -m learner``, cartpole config) and ``--hosts`` simulated actor hosts, one process each,
at full rate: each registers on the control socket like a real host (ops/soak/genuine.py), heartbeats, and sends
genuine ROWS blocks with its token whenever its PUSH socket reports room. Nothing steps an env, so the learner's
ingest and update loop are what is measured. Printed (one JSON object, with the machine):

* per host: rows its socket took, the least and largest share of the mean (no host starved), and how often its
  socket had no room (``pollout_false_fraction``) and the fraction of time it waited for room (back-pressure);
* the learner's side: rows in the messages it accepted (its agent_steps over the rows' steps), of which fresh
  (not dropped as stale or future), messages dropped by reason, updates, and its VmRSS sampled every second
  (first, largest, last).

Usage: .venv/bin/python -m ops.bench.load [--hosts 16] [--seconds 30] [--config configs/cartpole.yaml]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import zmq

from ops.benchlib import emit, end_process, run_stoppable
from ops.soak.genuine import RegisteredSender  # the soak harness's registered sender and its process stack
from ops.soak.stack import Stack, StackOptions, read_metrics, rss_kib
from protocol import encode

KEEPALIVE_EVERY = 16
"""Messages between a host's heartbeat checks (its version follows the learner's through the answers)."""


@dataclass(frozen=True, kw_only=True)
class HostFigures:
    """What one simulated host measured."""

    name: str
    """Its registered name."""
    messages: int
    """ROWS blocks its PUSH socket took."""
    rows: int
    """Rows in them."""
    polls: int
    """Times it asked its socket for room."""
    polls_full: int
    """Times there was none."""
    wait_s: float
    """Seconds it waited for room."""
    seconds: float
    """Seconds it sent for."""
    refusals: dict[str, int]
    """ERROR answers to its heartbeats, by reason (it must stay registered)."""


def simulated_host(control_url: str, name: str, seconds: float, seed: int, ready, start, results) -> None:
    """One simulated actor host: register, then send valid ROWS at full rate for ``seconds``."""
    context = zmq.Context()
    sender = RegisteredSender(context, control_url=control_url, name=name)
    ready.put(name)
    rng = np.random.default_rng(seed)
    rows = sender.shape.sizing.rows
    start.wait()
    began = time.monotonic()
    frames, version = None, None
    try:
        while time.monotonic() - began < seconds:
            if sender.counts.messages % KEEPALIVE_EVERY == 0:
                sender.keep_alive()
            if sender.version != version:  # acted by the newest weights the learner announced
                version = sender.version
                frames = encode(sender.rows_message(rows, rng))
            if sender.send(frames, timeout_s=0.2):
                sender.counts.rows += rows
        counts = sender.counts
        results.put(asdict(HostFigures(name=name, messages=counts.messages, rows=counts.rows, polls=counts.polls,
                                       polls_full=counts.polls_full, wait_s=counts.wait_s,
                                       seconds=time.monotonic() - began, refusals=dict(sender.replies_refused))))
    finally:
        sender.close()
        context.destroy(linger=0)


def measure(args: argparse.Namespace, work_dir: Path) -> dict:
    """Start the learner and the hosts, let them run, and gather every figure."""
    stack = Stack(StackOptions(config=args.config, overrides=tuple(args.set), host_workers=0, pool_server=False,
                               work_dir=work_dir))
    spawn = mp.get_context("spawn")
    ready, start, results = spawn.Queue(), spawn.Event(), spawn.Queue()
    hosts = []
    try:
        stack.start(first_updates=0, timeout_s=120)
        for index in range(args.hosts):
            hosts.append(spawn.Process(target=simulated_host, args=(stack.control_url, f"load-{index:02d}",
                                                                    args.seconds, index, ready, start, results)))
            hosts[-1].start()
        pid = stack.learner().pid
        for _ in hosts:  # every host registered (each imports torch to learn the policy's state size)
            ready.get(timeout=300)
        first = (read_metrics(stack.run_dir) or [{}])[-1]
        start.set()
        rss = []
        began = time.monotonic()
        while time.monotonic() - began < args.seconds:
            rss.append(rss_kib(pid) or 0)
            time.sleep(1.0)
        figures = [results.get(timeout=60) for _ in hosts]
        last = (read_metrics(stack.run_dir) or [{}])[-1]
        rss.append(rss_kib(pid) or 0)
        learner_alive = stack.learner().poll() is None
    finally:
        for host in hosts:
            end_process(host, timeout_s=10)
        leftovers = stack.close()
    return summarise(args, figures, first, last, rss, learner_alive, leftovers)


def summarise(args, figures: list[dict], first: dict, last: dict, rss: list[int], learner_alive: bool,
              leftovers) -> dict:
    """The benchmark's record from the hosts' figures and the learner's first and last metrics records."""
    rows = np.array([f["rows"] for f in figures], dtype=np.float64)
    seconds = max(f["seconds"] for f in figures)
    polls = np.array([max(1, f["polls"]) for f in figures], dtype=np.float64)
    full = np.array([f["polls_full"] for f in figures], dtype=np.float64) / polls
    waited = np.array([f["wait_s"] / max(1e-9, f["seconds"]) for f in figures])
    was = Counter(first.get("messages_dropped_by_reason", {}))
    dropped = {k: v - was[k] for k, v in last.get("messages_dropped_by_reason", {}).items() if v - was[k]}
    horizon_steps = _row_steps(args)
    accepted_rows = (last.get("agent_steps", 0) - first.get("agent_steps", 0)) / horizon_steps
    stale = last.get("rows_dropped_stale", 0) - first.get("rows_dropped_stale", 0)
    future = last.get("rows_dropped_future", 0) - first.get("rows_dropped_future", 0)
    return {
        "bench": "load", "hosts": args.hosts, "seconds": round(seconds, 1), "config": args.config,
        "rows_sent_per_s": round(float(rows.sum()) / seconds, 1),
        "rows_in_accepted_messages_per_s": round(accepted_rows / seconds, 1),
        "rows_fresh_per_s": round((accepted_rows - stale - future) / seconds, 1),
        "rows_per_host_min": int(rows.min()), "rows_per_host_max": int(rows.max()),
        "host_share_min_over_mean": round(float(rows.min() / max(1.0, rows.mean())), 3),
        "host_share_max_over_mean": round(float(rows.max() / max(1.0, rows.mean())), 3),
        "hosts_starved": int((rows == 0).sum()),
        "pollout_false_fraction_mean": round(float(full.mean()), 3),
        "pollout_false_fraction_max": round(float(full.max()), 3),
        "send_wait_fraction_mean": round(float(waited.mean()), 3),
        "messages_dropped_by_reason": dropped,
        "rows_dropped_stale": stale, "rows_dropped_future": future,
        "updates": last.get("update", 0) - first.get("update", 0),
        "policy_lag_max_last": last.get("policy_lag_max"),
        "actor_hosts_last": last.get("actor_hosts"),
        "host_refusals": {f["name"]: f["refusals"] for f in figures if f["refusals"]},
        "learner_rss_mib_first": round(rss[0] / 1024, 1), "learner_rss_mib_max": round(max(rss) / 1024, 1),
        "learner_rss_mib_last": round(rss[-1] / 1024, 1),
        "learner_alive": learner_alive, "leftover_processes": list(leftovers.processes),
        "leftover_shm": list(leftovers.shm_segments),
    }


def _row_steps(args) -> int:
    """Agent steps one row reports (bptt_horizon): the simulated hosts report rows x bptt_horizon agent steps."""
    from configs.loader import load_config
    return load_config(args.config, args.set).trainer.bptt_horizon


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ops.bench.load", description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=16, help="simulated actor hosts (default %(default)s)")
    parser.add_argument("--seconds", type=float, default=30.0, help="sending window (default %(default)s)")
    parser.add_argument("--config", default="configs/cartpole.yaml", help="the learner's config (default %(default)s)")
    parser.add_argument("--set", action="append", default=["trainer.target_episode_return=null",
                                                           "trainer.total_timesteps=10000000000"],
                        metavar="SECTION.KEY=VALUE", help="learner config overrides (repeatable)")
    args = parser.parse_args(argv)
    if args.hosts < 1 or args.seconds <= 0:
        parser.error(f"--hosts must be >= 1 and --seconds > 0, got {args.hosts} and {args.seconds}")
    with tempfile.TemporaryDirectory(prefix="sluice-load-") as scratch:
        emit(measure(args, Path(scratch)))
    return 0


if __name__ == "__main__":
    run_stoppable(main)
