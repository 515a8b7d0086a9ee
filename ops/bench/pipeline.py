"""Benchmark: the actor pipeline against the same envs stepped raw (pipeline overhead, inference, double buffering).

For each env and async_factor, two measurements on the same envs, the same number of processes and the same
env batches (``async_factor`` groups of ``envs_per_worker / async_factor`` envs per process):

* **raw**: ``--workers`` plain processes step their env groups with pre-drawn random actions, nothing else;
* **pipeline**: a real ``python -m actors --n <workers> --null-policy`` host (env worker processes, shared
  memory, the inference step choosing uniformly random actions without a network, the numba assembler, the
  ZeroMQ sender) streaming to a sink in this process that registers it like the learner does (the real
  ``ControlServer``), then receives and decodes every ROWS message without training on it.

``pipeline_over_raw = pipeline_agent_steps_per_s / raw_agent_steps_per_s`` (targets: >= 0.8 on the
20-microsecond synthetic env, >= 0.5 on the gridworld). That ratio depends on the machine (its cores, its load); the
figures that do not are CPU-microseconds per agent step: ``env_cpu_us_per_agent_step`` (the raw env's own, ``e``),
``cpu_us_per_agent_step_{host,workers,sink}`` per process kind, ``workers_beyond_env_us_per_agent_step``, the overhead
``o = host + sink + workers beyond e``, ``predicted_pipeline_over_raw = e / (e + o)`` (what a CPU-bound machine gives)
beside the measured ratio, and ``host_max_agent_steps_per_s`` (1e6 / host us: what one host process sustains at 100%
of its core). ``--rounds N`` measures raw and pipeline in turn N times, each record with the load average before it.
The pipeline record also carries what the host reports in its ROWS messages: the batch size the inference step
reaches against forward_pass_minibatch_target_size, ms per forward pass and per inference step, and the fraction of
time env workers wait for actions; the ROWS messages received per second (``messages_per_s``); plus CPU seconds per
process kind, which is where the overhead goes. ``ops.bench.fixed_costs`` sweeps group and message sizes over this
pipeline and splits each process kind's cost into per group, per message and per agent step.

``--transport shm`` (the default: what a learner on the host's machine gives it) has the sink announce an ``ipc://``
route for its data socket (protocol/same_machine.py) and read rows from the host's shared memory
(protocol/shared_rows.py) as the learner does; ``--transport ipc`` sends the rows in the messages over that route,
``--transport tcp`` over TCP on loopback. The record names the transport, checked against the connection the sink
accepted and the messages it read. The sink copies each message's rows once, as the ingest copies them into its batch.

``--policy model`` runs the run config's real policy instead (its initial weights; the gridworld's is a CNN, the
``spread`` env's an MLP with box actions, which the host runs as its NumPy twin), and
``--actor-device cuda`` runs that policy on the GPU (``python -m actors --device cuda``; ops/bench/gpu_check.sh).

Usage: .venv/bin/python -m ops.bench.pipeline [--envs cartpole grid3 grid24 synthetic20us] [--workers 2]
[--envs-per-worker N] [--async-factor 1 2] [--seconds 10] [--policy null|model] [--actor-device cpu|cuda]
[--transport shm|ipc|tcp] [--hosts K] [--worker-nice N] [--worker-scheduler batch|normal]

``--worker-nice N`` runs the pipeline's env workers at N added niceness (``python -m actors --worker-nice``): the
host's loop then gets the CPU before them when every core is busy. ``--worker-scheduler`` sets their Linux
scheduling policy (``python -m actors --worker-scheduler``; batch, the default, or normal).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import zmq

from actors.cli import WORKER_SCHEDULERS
from configs.loader import config_to_dict, load_config
from configs.plan import make_plan
from configs.schema import RunConfig
from envs.base import StepBuffers
from envs.registry import env_spec, make_vec_env
from envs.rows import MessageSizing, message_sizing, run_row_layout
from learner.serve.control import ControlServer
from learner.serve.host_sizing import HostSizing
from learner.serve.ingest_counters import host_timing
from learner.serve.senders import SenderRegistry
from ops.bench.host_stages import WITHOUT, stages_for
from ops.bench.pipeline_sink import Sink, accepted_transports
from ops.benchlib import emit, end_process, run_stoppable
from policies.factory import make_policy, state_arrays
from protocol import Limits
from protocol.message_memory import keep_freed_memory
from protocol.same_machine import bind_ipc, data_ipc_path, remove_ipc_file

REPO = Path(__file__).resolve().parents[2]
ENVS: dict[str, tuple[str, list[str]]] = {
    "cartpole": ("configs/cartpole.yaml", []),
    "grid3": ("configs/grid_3agents.yaml", []),
    "grid24": ("configs/grid_24agents.yaml", []),
    "spread": ("configs/simple_spread.yaml", []),
    "synthetic20us": ("configs/cartpole.yaml", ["env.name=native",
                                                "env.entry_point=envs.builtin.synthetic:SyntheticVec",
                                                "env.kwargs={step_us: 20}"]),
}
"""Benchmark env name -> (run config, overrides)."""
DEFAULT_ENVS = ("cartpole", "grid3", "grid24", "synthetic20us")
"""What a run without --envs measures."""
TARGETS = {"synthetic20us": 0.8, "grid3": 0.5, "grid24": 0.5}
TRANSPORTS = ("shm", "ipc", "tcp")
"""How rows reach the sink: over the unix socket a learner on the host's machine offers, or TCP over loopback."""
ACTIONS_CYCLE = 64


def bench_config(env: str, workers: int, envs_per_worker: int | None, async_factor: int,
                 extra: tuple[str, ...] = (), host_processes: int = 1) -> RunConfig:
    """The env's run config sized to ``workers`` x ``envs_per_worker`` envs (default: what the run config plans
    for ``workers``) in ``async_factor`` groups, then the ``extra`` overrides (--set). With several host processes
    each plans its share of the workers, so the forward-pass target is one host's: the same envs and groups in all."""
    path, overrides = ENVS[env]
    config = load_config(REPO / path, overrides)
    sizing = [f"trainer.num_workers={workers}", f"trainer.async_factor={async_factor}"]
    if envs_per_worker is None:  # the run config's own plan, kept the same for every async_factor compared
        shipped = make_plan(config.trainer, num_agents=config.env.num_agents, num_workers=workers)
        envs_per_worker = shipped.envs_per_worker
    if envs_per_worker % async_factor:
        raise SystemExit(f"--envs-per-worker {envs_per_worker} must be divisible by async_factor {async_factor}")
    if workers % host_processes:
        raise SystemExit(f"--workers {workers} must be divisible by --hosts {host_processes}")
    target = envs_per_worker * (workers // host_processes) // async_factor * config.env.num_agents
    total_agents = envs_per_worker * workers * config.env.num_agents
    batch = max(config.trainer.batch_size, total_agents * config.trainer.bptt_horizon)
    sizing += [f"trainer.forward_pass_minibatch_target_size={target}",  # the batch only has to hold the rows
               f"trainer.batch_size={batch}", f"trainer.minibatch_size={batch}"]
    return load_config(REPO / path, [*overrides, *sizing, *extra])


# -- raw: the same env groups, stepped by plain processes ------------------------------------------------

def _raw_worker(config: RunConfig, groups: int, envs_per_group: int, seed: int, ready, start, seconds: float,
                results) -> None:
    envs = [make_vec_env(config.env, envs_per_group) for _ in range(groups)]
    buffers = [StepBuffers.allocate(env.spec, envs_per_group) for env in envs]
    rng = np.random.default_rng(seed)
    spec = envs[0].spec
    slots = envs_per_group * spec.num_agents
    if spec.action.kind == "box":
        actions = rng.standard_normal((ACTIONS_CYCLE, slots, *spec.action.shape)).astype(np.float32)
    else:
        nvec = np.asarray(spec.action.nvec).reshape(spec.action.shape or ())
        actions = (rng.random((ACTIONS_CYCLE, slots, *spec.action.shape)) * nvec).astype(np.int32)
    for g, env in enumerate(envs):
        env.reset(buffers[g], seed + g)
    warm_until = time.perf_counter() + 1.0
    k = 0
    while time.perf_counter() < warm_until or k < 20:  # numba compilation / cache load
        for g, env in enumerate(envs):
            buffers[g].actions[:] = actions[k % ACTIONS_CYCLE]
            env.step(buffers[g])
        k += 1
    ready.put(os.getpid())
    start.wait()
    agent_steps, began, cpu_began = 0, time.perf_counter(), time.process_time()
    while True:
        for g, env in enumerate(envs):
            buffers[g].actions[:] = actions[k % ACTIONS_CYCLE]
            env.step(buffers[g])
            agent_steps += int(buffers[g].active.sum())
        k += 1
        elapsed = time.perf_counter() - began
        if elapsed >= seconds:
            break
    cpu = time.process_time() - cpu_began
    for env in envs:
        env.close()
    results.put((agent_steps, elapsed, cpu))


def measure_raw(config: RunConfig, workers: int, seconds: float, host_processes: int = 1) -> dict:
    """Aggregate agent steps/s of ``workers`` processes stepping the env groups the actor host(s) would run."""
    plan = make_plan(config.trainer, num_agents=config.env.num_agents, num_workers=workers // host_processes)
    groups = config.trainer.async_factor
    context = mp.get_context("spawn")
    ready, results, start = context.Queue(), context.Queue(), context.Event()
    procs = [context.Process(target=_raw_worker, args=(config, groups, plan.envs_per_worker // groups, 1000 * w,
                                                        ready, start, seconds, results), daemon=True)
             for w in range(workers)]
    try:
        for proc in procs:
            proc.start()
        for _ in procs:
            ready.get(timeout=120)
        start.set()
        outcomes = [results.get(timeout=seconds + 60) for _ in procs]
    finally:
        for proc in procs:
            end_process(proc, timeout_s=5)
    steps = sum(outcome[0] for outcome in outcomes)
    return {"raw_agent_steps_per_s": round(sum(steps / elapsed for steps, elapsed, _ in outcomes)),
            "env_cpu_us_per_agent_step": round(1e6 * sum(outcome[2] for outcome in outcomes) / max(steps, 1), 3)}


# -- pipeline: a real actor host with the null policy, and a sink that stands in for the learner -----------

def _cpu_seconds(pid: int) -> float:
    """user + system CPU seconds of one live process (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def _cpu_split(host_pid: int, host_processes: int = 1) -> dict[str, float]:
    """CPU seconds so far of the host process(es), their env workers and this process (the sink). With several host
    processes ``host_pid`` is their supervisor (``python -m actors --hosts``), counted with the hosts."""
    hosts = [host_pid] if host_processes == 1 else _children(host_pid)
    return {"host": sum(_cpu_seconds(p) for p in hosts) + (_cpu_seconds(host_pid) if host_processes > 1 else 0.0),
            "workers": sum(_cpu_seconds(w) for p in hosts for w in _children(p)), "sink": time.process_time()}


def _sizing(config: RunConfig, policy: str) -> MessageSizing:
    """Rows per message and the data sockets' high-water mark, as host and learner derive them for this host's
    rows (envs.rows.message_sizing)."""
    spec = env_spec(config.env)
    state_size = 0 if policy == "null" else make_policy(spec, config.model).state_size
    return message_sizing(config, run_row_layout(config, spec, state_size=state_size))


def measure_pipeline(config: RunConfig, workers: int, seconds: float, warmup_s: float = 3.0,
                     host_runner: Sequence[str] = ("-m", "actors"), policy: str = "null", actor_device: str = "cpu",
                     transport: str = "shm", host_processes: int = 1, worker_nice: int = 0,
                     worker_scheduler: str = "batch") -> dict:
    """Agent steps/s of a real actor host (``policy`` null: uniform random actions; model: the config's policy, its
    initial weights, on ``actor_device``; rows over ``transport``), and what it reports about inference and its
    workers. ``host_runner``: the interpreter's arguments that run ``python -m actors`` (or the same under a profiler),
    before the host's own."""
    net = config.network
    limits = Limits(max_message_bytes=net.max_message_bytes)
    context = zmq.Context()
    stop = threading.Event()
    data = context.socket(zmq.PULL)
    data.setsockopt(zmq.RCVHWM, _sizing(config, policy).hwm)
    data.setsockopt(zmq.RCVBUF, net.socket_buffer_bytes)
    data.setsockopt(zmq.LINGER, 0)
    data_port = data.bind_to_random_port("tcp://127.0.0.1")
    accepted = data.get_monitor_socket(zmq.EVENT_ACCEPTED)
    route = bind_ipc(data, data_ipc_path(os.getpid(), 0)) if transport != "tcp" else None
    if transport != "tcp" and route is None:
        raise SystemExit(f"--transport {transport}: the sink could not bind its ipc socket (see the warning above)")
    probe = context.socket(zmq.PUB)
    weights_port = probe.bind_to_random_port("tcp://127.0.0.1")  # the host subscribes; nothing is published
    control_port = _free_port()
    registration = {"config": config_to_dict(config), "data_endpoint": f"tcp://127.0.0.1:{data_port}",
                    "weights_endpoint": f"tcp://127.0.0.1:{weights_port}", "run_id": uuid.uuid4().hex,
                    "packed_rows": True}  # as the learner's (learner/serve/serving.py): rows come in one frame
    if route is not None:
        registration["data_ipc"] = {registration["data_endpoint"]: route.to_field()}
    if transport == "shm":
        registration["shared_rows"] = True  # as the learner's: rows stay in the host's shared memory
    registry = SenderRegistry()
    control = ControlServer(context=context, endpoint=f"tcp://127.0.0.1:{control_port}", registration=registration,
                            peer_timeout_s=net.peer_timeout_s, limits=limits, stop=stop, registry=registry,
                            sizing=HostSizing(trainer=config.trainer, num_agents=config.env.num_agents))
    control.set_weights(0, {} if policy == "null" else state_arrays(make_policy(env_spec(config.env), config.model)))
    sink = Sink(data, limits, registry=registry, shared_rows=transport == "shm")
    counters = sink.counters
    drain = threading.Thread(target=sink.run, args=(stop,), name="sink", daemon=True)
    control.start()
    drain.start()
    policy_args = ["--null-policy"] if policy == "null" else ["--device", actor_device]
    host_args = ["--hosts", str(host_processes)] if host_processes > 1 else []
    host_args += ["--worker-nice", str(worker_nice), "--worker-scheduler", worker_scheduler]
    host = subprocess.Popen([sys.executable, *host_runner, "--n", str(workers), *host_args, *policy_args, "--learner",
                             f"tcp://127.0.0.1:{control_port}"], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while counters.snapshot()["messages"] == 0:
            if host.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"actor host sent no rows (exit {host.poll()}): {host.stderr.read()[-2000:]}")
            time.sleep(0.1)
        time.sleep(warmup_s)
        first, cpu_first, began = counters.snapshot(), _cpu_split(host.pid, host_processes), time.monotonic()
        time.sleep(seconds)
        last, cpu_last, elapsed = counters.snapshot(), _cpu_split(host.pid, host_processes), time.monotonic() - began
    finally:
        control.begin_shutdown("benchmark done")
        try:
            host.wait(timeout=3 * net.heartbeat_interval_s + 10)
        except subprocess.TimeoutExpired:
            host.terminate()
            host.wait(timeout=10)
        stop.set()
        control.join(timeout=5)
        drain.join(timeout=5)
        used = accepted_transports(accepted)
        data.disable_monitor()
        accepted.close(linger=0)
        data.close(linger=0)
        if route is not None:
            remove_ipc_file(route)
        probe.close(linger=0)
        context.term()
    if used != {"ipc" if transport == "shm" else transport}:
        raise RuntimeError(f"--transport {transport}: the actor host connected over {sorted(used) or 'nothing'}")
    shared = last["shared"] - first["shared"]
    if shared and transport != "shm":
        raise RuntimeError(f"--transport {transport}: {shared} messages left their rows in shared memory")
    stats = {name: last["host_stats"].get(name, 0.0) - first["host_stats"].get(name, 0.0)
             for name in last["host_stats"]}
    timing = host_timing(stats)
    cpu = {f"cpu_s_per_s_{kind}": round((cpu_last[kind] - cpu_first[kind]) / elapsed, 2) for kind in cpu_last}
    agent_steps = max(last["agent_steps"] - first["agent_steps"], 1)
    cpu_us = {f"cpu_us_per_agent_step_{kind}": round(1e6 * (cpu_last[kind] - cpu_first[kind]) / agent_steps, 3)
              for kind in cpu_last}
    return {
        "pipeline_agent_steps_per_s": round((last["agent_steps"] - first["agent_steps"]) / elapsed),
        "pipeline_env_steps_per_s": round((last["env_steps"] - first["env_steps"]) / elapsed),
        "wire_mb_per_s": round((last["bytes"] - first["bytes"]) / elapsed / 1e6, 1),
        "messages_per_s": round((last["messages"] - first["messages"]) / elapsed, 1),
        "messages_rejected": last["rejected"],
        "messages_shared_fraction": round(shared / max(last["messages"] - first["messages"], 1), 3),
        "inference_batch_agents_mean": _round(timing["inference_batch_agents_mean"], 1),
        "inference_ms_per_batch": _round(timing["inference_ms_per_batch"], 3),
        "act_ms_per_batch": _round(timing["act_ms_per_batch"], 3),
        "worker_wait_fraction": _round(timing["worker_wait_fraction"], 3),
        **cpu,
        **cpu_us,
    }


def overhead_figures(record: dict) -> dict:
    """The machine-independent figures of one raw + pipeline pair: the env's own CPU-us per agent step ``e``, the
    pipeline's overhead ``o`` (host + sink + the workers' CPU beyond ``e``), the ratio ``e / (e + o)`` that a CPU-bound
    machine predicts for pipeline/raw, and the agent steps/s one host process would sustain at 100% of a core."""
    env_us = record["env_cpu_us_per_agent_step"]
    host_us, sink_us = record["cpu_us_per_agent_step_host"], record["cpu_us_per_agent_step_sink"]
    workers_beyond_env_us = record["cpu_us_per_agent_step_workers"] - env_us
    overhead_us = host_us + sink_us + workers_beyond_env_us
    return {"workers_beyond_env_us_per_agent_step": round(workers_beyond_env_us, 3),
            "overhead_us_per_agent_step": round(overhead_us, 3),
            "predicted_pipeline_over_raw": round(env_us / (env_us + overhead_us), 3) if env_us + overhead_us > 0 else None,
            "host_max_agent_steps_per_s": round(1e6 / host_us) if host_us > 0 else None}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def measure_round(record: dict, config: RunConfig, args: argparse.Namespace, round_number: int) -> dict:
    """One round: raw (unless --pipeline-only), then the pipeline, each with the 1-minute load average before it."""
    record = {**record, "round": round_number}
    if not args.pipeline_only:
        record["load_before_raw"] = round(os.getloadavg()[0], 2)
        record.update(measure_raw(config, args.workers, args.seconds, args.hosts))
    record["load_before_pipeline"] = round(os.getloadavg()[0], 2)
    stages = Path(tempfile.gettempdir()) / f"sluice_host_stages_{os.getpid()}.json"
    host_runner = (["-m", "cProfile", "-o", args.profile_host, "-m", "actors"] if args.profile_host
                   else ["-m", "ops.bench.host_stages", "--out", str(stages),
                         *[f"--without={work}" for work in args.host_without], "--"] if args.host_stages
                   else ["-m", "actors"])
    try:
        record.update(measure_pipeline(config, args.workers, args.seconds, host_runner=host_runner,
                                       policy=args.policy, actor_device=args.actor_device, transport=args.transport,
                                       host_processes=args.hosts, worker_nice=args.worker_nice,
                                       worker_scheduler=args.worker_scheduler))
        if args.host_stages and not stages.exists():
            raise RuntimeError("--host-stages: the actor host ended without writing its stages (was it killed?)")
        if args.host_stages:
            record.update(stages_for(json.loads(stages.read_text())))
    finally:
        stages.unlink(missing_ok=True)
    if not args.pipeline_only:
        record["pipeline_over_raw"] = round(record["pipeline_agent_steps_per_s"] / record["raw_agent_steps_per_s"], 3)
        record["target"] = TARGETS.get(record["env"])
        record.update(overhead_figures(record))
    elif record["cpu_us_per_agent_step_host"] > 0:
        record["host_max_agent_steps_per_s"] = round(1e6 / record["cpu_us_per_agent_step_host"])
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=list(DEFAULT_ENVS), choices=list(ENVS),
                        help=f"default: {' '.join(DEFAULT_ENVS)} (spread: the built-in simple_spread, box actions)")
    parser.add_argument("--workers", type=int, default=2, help="env worker processes (raw: plain processes)")
    parser.add_argument("--envs-per-worker", type=int, default=None,
                        help="envs per worker (default: what the env's run config plans)")
    parser.add_argument("--async-factor", type=int, nargs="+", default=[2, 1],
                        help="env groups per worker to measure (2 = double buffering)")
    parser.add_argument("--seconds", type=float, default=10.0, help="measurement window of each run")
    parser.add_argument("--pipeline-only", action="store_true", help="skip the raw measurement")
    parser.add_argument("--rounds", type=int, default=1,
                        help="raw and pipeline measured in turn this many times (one record per round, with the "
                             "machine's load average)")
    parser.add_argument("--policy", choices=("null", "model"), default="null",
                        help="the host's policy: null (uniform random actions, no network; the default) or model "
                             "(the run config's policy with its initial weights)")
    parser.add_argument("--actor-device", choices=("cpu", "cuda"), default="cpu",
                        help="with --policy model: where the host runs it (python -m actors --device)")
    parser.add_argument("--transport", choices=TRANSPORTS, default="shm",
                        help="how rows reach the sink: shm (left in the host's shared memory, the message over the "
                             "unix socket a learner on this machine offers; the default), ipc (in the messages over "
                             "that socket) or tcp (in the messages over loopback)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override after the bench's own sizing (e.g. network.send_queue_messages=32)")
    parser.add_argument("--hosts", type=int, default=1,
                        help="host processes the workers are split among (python -m actors --hosts); the host "
                             "figures then sum them, and one host's max agent steps/s is per host process")
    parser.add_argument("--worker-nice", type=int, default=0, metavar="N",
                        help="the pipeline's env workers run at this added niceness (python -m actors --worker-nice)")
    parser.add_argument("--worker-scheduler", choices=WORKER_SCHEDULERS, default="batch",
                        help="the pipeline's env workers' scheduling policy (python -m actors --worker-scheduler)")
    parser.add_argument("--profile-host", metavar="PATH", default=None,
                        help="run the actor host under cProfile, writing PATH (read it with python -m pstats)")
    parser.add_argument("--host-stages", action="store_true",
                        help="time each stage of the host's loop in thread CPU (ops.bench.host_stages) and add its "
                             "CPU-us per agent step to the record")
    parser.add_argument("--host-without", action="append", choices=WITHOUT, default=[],
                        help="with --host-stages: leave this work out of the host's loop, to measure what a design "
                             "that spares it would save (gather: rows are not copied into the shared-memory slot; "
                             "add_obs: the assembler does not copy observations into the rows; the sink reads stale "
                             "or poisoned rows); named in the record; repeatable")
    args = parser.parse_args()
    if args.host_without and not args.host_stages:
        parser.error("--host-without changes what --host-stages times: add --host-stages")
    if "gather" in args.host_without and args.transport != "shm":
        parser.error("--host-without gather leaves rows out of the shared-memory slot: it needs --transport shm")
    if args.hosts > 1 and (args.profile_host or args.host_stages):
        parser.error("--profile-host and --host-stages time one host process: leave --hosts out")
    if args.profile_host and args.host_stages:
        parser.error("--profile-host or --host-stages: one at a time")
    keep_freed_memory()  # the sink decodes what the learner's ingest would, tuned as the learner is
    for env in args.envs:
        for async_factor in args.async_factor:
            config = bench_config(env, args.workers, args.envs_per_worker, async_factor, tuple(args.overrides),
                                  args.hosts)
            plan = make_plan(config.trainer, num_agents=config.env.num_agents, num_workers=args.workers // args.hosts)
            record = {"bench": "pipeline", "env": env, "num_agents": config.env.num_agents,
                      "obs_shape": list(env_spec(config.env).obs_shape), "workers": args.workers,
                      "envs_per_worker": plan.envs_per_worker, "async_factor": async_factor,
                      "forward_pass_minibatch_target_size": config.trainer.forward_pass_minibatch_target_size,
                      "bptt_horizon": config.trainer.bptt_horizon, "seconds": args.seconds,
                      "host_processes": args.hosts, "worker_nice": args.worker_nice,
                      "worker_scheduler": args.worker_scheduler, "policy": args.policy,
                      "actor_device": args.actor_device,
                      "transport": args.transport, **({"host_without": args.host_without} if args.host_without else {}),
                      "overrides": args.overrides, "rows_per_message": _sizing(config, args.policy).rows,
                      "data_hwm": _sizing(config, args.policy).hwm}
            for round_number in range(1, args.rounds + 1):
                emit(measure_round(record, config, args, round_number))


if __name__ == "__main__":
    run_stoppable(main)
