"""Benchmark: PPO training fed by row blocks over ZeroMQ against the same training on blocks already in memory.

One batch worth of ROWS blocks is built (the fields, host_stats included, and arrays ``actors/host.py``
``_ship`` sends, encoded with ``protocol.encode``). Two ways to train on them, each as ``Learner._train``
does it (``to_batch`` -> ``ppo_update`` on one of two host buffers):

  * memory: the two batch buffers are filled once from the decoded blocks; the loop just trains.
  * zmq: a synthetic sender process (this script with ``--sender``) pushes the pre-encoded blocks over a real
    PUSH socket on tcp://127.0.0.1 as fast as the high-water mark lets it, into a real
    ``learner.serve.ingest.Ingest`` thread; the loop takes a full buffer (``ingest.slots.next_full``) and gives it
    back (``ingest.slots.release``).

``ingest_ratio = zmq_samples_per_s / memory_samples_per_s`` (samples: agent steps trained, batch_size per
update); target 0.9. Phases alternate (memory, zmq, memory, zmq, ...) because the machine may be shared; the
headline is the median over rounds of zmq phase / memory phase (the ratio of totals is reported too). Each
zmq phase first trains once, untimed, on a buffer the ingest thread filled while the memory phase ran; from
then on every timed update overlaps the ingest filling the other buffer (steady state). Also reported: the
time the loop waited for a ready buffer and the ingest thread's CPU seconds per batch it filled.

Also checked and reported: the ingest buffer's obs dtype is the env's obs dtype (uint8 for the gridworld),
the obs frame on the wire is that dtype (1 byte per element for the gridworld), no message or row was
dropped, and every batch the ingest thread filled equals the in-memory batch byte for byte (the sender
cycles exactly one batch of blocks).

The default gridworld case is scaled down so an update takes about a second on a 2-core CPU:
forward_pass_minibatch_target_size=64 (fewer agents, so a smaller batch passes the plan's checks),
batch_size=16384, minibatch_size=4096. The cartpole case runs configs/cartpole.yaml as is.

Prints one JSON object per phase, one per check, and one ``ingest`` headline per case.
Usage: .venv/bin/python -m ops.bench.ingest [--config configs/grid_3agents.yaml --set trainer.key=value ...]
[--updates N] [--rounds 3]   (with no --config: the two default cases)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import torch
import zmq

from configs.loader import load_config
from configs.plan import make_plan
from envs.registry import env_spec
from envs.rows import MessageSizing, message_sizing, row_layout, run_row_layout
from learner.ppo.algorithm import make_optimizer, make_reference
from learner.ppo.schedules import schedule_for
from learner.ppo.update import ppo_update
from learner.serve.ingest import Ingest
from learner.serve.senders import Sender, SenderRegistry
from learner.update.batch import BatchBuffers, to_batch
from ops.benchlib import emit
from policies.factory import make_policy
from protocol import Limits, Message, MessageType, decode, encode
from protocol.rows import RowLayout

TARGET = 0.9
GRID_SCALE = ["trainer.forward_pass_minibatch_target_size=64", "trainer.batch_size=16384",
              "trainer.minibatch_size=4096"]
DEFAULT_CASES = [("configs/grid_3agents.yaml", GRID_SCALE, 3), ("configs/cartpole.yaml", [], 12)]
SENDER_POLL_MS = 100
BENCH_TOKEN = "bench" * 6 + "00"
"""The registration token the synthetic sender's blocks carry (the ingest only takes rows from registered hosts)."""


def sizing_of(config, state_size: int) -> MessageSizing:
    """Rows per ROWS message and the data sockets' high-water mark, as hosts and learner derive them."""
    return message_sizing(config, run_row_layout(config, env_spec(config.env), state_size=state_size))


def make_blocks(config, state_size: int, seed: int) -> list[Message]:
    """One batch of ROWS messages (rows_per_message rows each, the last one shorter if needed)."""
    spec = env_spec(config.env)
    trainer = config.trainer
    plan = make_plan(trainer, num_agents=config.env.num_agents)
    horizon = trainer.bptt_horizon + 1
    layout = row_layout(spec, horizon=horizon, state_size=state_size)
    rows_per_message = message_sizing(config, layout).rows
    rng = np.random.default_rng(seed)
    action = spec.action
    messages = []
    for start in range(0, plan.segments, rows_per_message):
        n = min(rows_per_message, plan.segments - start)
        if np.dtype(spec.obs_dtype).kind in "ui":
            obs = rng.integers(0, 4, (n, horizon, *spec.obs_shape)).astype(spec.obs_dtype)
        else:
            obs = rng.standard_normal((n, horizon, *spec.obs_shape)).astype(spec.obs_dtype)
        if action.kind == "box":
            actions = rng.standard_normal((n, horizon, *action.shape)).astype(action.dtype)
            logprobs = (-0.919 * max(1, int(np.prod(action.shape))) - 0.5 * rng.random((n, horizon)))
        else:
            nvec = np.asarray(action.nvec).reshape(action.shape) if action.shape else int(action.nvec[0])
            actions = (rng.random((n, horizon, *action.shape)) * nvec).astype(action.dtype)
            uniform = -float(np.log(np.asarray(action.nvec, dtype=np.float64)).sum())
            logprobs = uniform + 0.05 * rng.standard_normal((n, horizon))
        episodes = int(rng.integers(0, 3))
        arrays = layout.allocate(n)  # every field is set below (a poison value left over would be rejected)
        arrays["obs"][:] = obs
        arrays["actions"][:] = actions
        arrays["action_masks"][:] = 1
        arrays["logprobs"][:] = logprobs
        arrays["values"][:] = 0.1 * rng.standard_normal((n, horizon))
        arrays["rewards"][:] = rng.random((n, horizon)) < 0.02
        arrays["dones"][:] = rng.random((n, horizon)) < 0.002
        for name in ("bootstrap", "versions", "states"):
            arrays[name][:] = 0
        fields = {"num_rows": n, "episode_returns": [float(r) for r in rng.random(episodes) * 10],
                  "episode_lengths": [int(x) for x in rng.integers(1, 1000, episodes)],
                  "env_steps": -(-n * trainer.bptt_horizon // max(1, spec.num_agents)),
                  "agent_steps": n * trainer.bptt_horizon, "env_restarts": 0, "token": BENCH_TOKEN,
                  "episode_stats": {name: [float(v) for v in rng.random(episodes)] for name in spec.episode_stats},
                  "host_stats": {"inference_batches": 2, "inference_agents": 2 * n, "inference_s": 0.002,
                                 "act_s": 0.004, "worker_wait_s": 0.001, "worker_step_s": 0.003}}
        messages.append(Message(type=MessageType.ROWS, sender="bench-sender", version=0, fields=fields,
                                arrays=arrays))
    return messages


# ------------------------------------------------------------------ sender process (``--sender``)

def sender_main(args: argparse.Namespace) -> None:
    """Push the pre-encoded blocks round-robin until SIGTERM or the parent goes away; print the count."""
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    parent = os.getppid()
    config = load_config(args.config, args.overrides)
    frames = [encode(m) for m in make_blocks(config, args.state_size, args.seed)]
    context = zmq.Context()
    sock = context.socket(zmq.PUSH)
    sent = 0
    try:
        sock.setsockopt(zmq.SNDHWM, sizing_of(config, args.state_size).hwm)
        sock.setsockopt(zmq.SNDBUF, config.network.socket_buffer_bytes)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IMMEDIATE, 1)
        sock.connect(args.sender)
        while not stopping.is_set() and os.getppid() == parent:
            if sock.poll(SENDER_POLL_MS, zmq.POLLOUT):
                sock.send_multipart(frames[sent % len(frames)], copy=False)
                sent += 1
    finally:
        sock.close(linger=0)
        context.term()
        print(json.dumps({"messages_sent": sent}), flush=True)


# ------------------------------------------------------------------ learner side

class Trainer:
    """The learner's update loop body, shared by both paths (one policy, optimizer and schedule)."""

    def __init__(self, config) -> None:
        torch.manual_seed(config.run.seed)
        self.config = config
        self.trainer = config.trainer
        self.spec = env_spec(config.env)
        self.plan = make_plan(config.trainer, num_agents=config.env.num_agents)
        self.device = torch.device("cpu")
        self.policy = make_policy(self.spec, config.model)
        self.optimizer = make_optimizer(self.policy, self.trainer)
        self.reference = make_reference(self.policy) if self.trainer.kl_divergence_coef_rho > 0 else None
        self.generator = torch.Generator().manual_seed(config.run.seed)
        self.update = 0

    def train(self, buffers: BatchBuffers) -> None:
        batch = to_batch(buffers, self.device)
        schedule = schedule_for(self.trainer, self.update, self.plan.total_epochs)
        ppo_update(self.policy, self.optimizer, batch, trainer=self.trainer, plan=self.plan, schedule=schedule,
                   generator=self.generator, reference=self.reference)
        self.update += 1


def thread_cpu_s(thread: threading.Thread) -> float:
    """CPU seconds (user + system) a running thread has used, from /proc (0.0 where that is unavailable)."""
    try:
        with open(f"/proc/self/task/{thread.native_id}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def memory_buffers(layout: RowLayout, segments: int, messages: list[Message]) -> BatchBuffers:
    """A batch buffer filled from the decoded blocks, as the ingest thread fills one."""
    buffers = BatchBuffers.allocate(layout, segments)
    arrays = buffers.arrays
    filled = 0
    for message in messages:
        n = len(message.arrays["versions"])
        for name, array in message.arrays.items():
            arrays[name][filled:filled + n] = array
        filled += n
    assert filled == segments, (filled, segments)
    return buffers


def run_memory(model: Trainer, buffers: list[BatchBuffers], updates: int) -> float:
    started = time.perf_counter()
    for k in range(updates):
        model.train(buffers[k % 2])
    return time.perf_counter() - started


def run_zmq(model: Trainer, ingest: Ingest, updates: int, drain: int,
            check=None) -> tuple[float, float, list[int]]:
    """``drain`` untimed updates on buffers filled while idle, then ``updates`` timed ones.

    ``check(buffers)``, when given, sees each batch before it is trained on and handed back."""
    waited, used = 0.0, []
    started = 0.0
    for k in range(drain + updates):
        if k == drain:
            started = time.perf_counter()
            waited = 0.0
        t0 = time.perf_counter()
        while True:
            if ingest.error is not None:
                raise RuntimeError("ingest thread failed") from ingest.error
            index = ingest.slots.next_full(timeout=1.0)
            if index is not None:
                break
            if not ingest.is_alive():
                raise RuntimeError("ingest thread stopped")
        waited += time.perf_counter() - t0
        used.append(index)
        if check is not None:
            check(ingest.slots.buffers[index])
        model.train(ingest.slots.buffers[index])
        ingest.slots.release(index)
    return time.perf_counter() - started, waited, used


def bench_case(config_path: str, overrides: list[str], updates: int, rounds: int) -> None:
    config = load_config(config_path, overrides)
    torch.set_num_threads(config.run.torch_threads)
    model = Trainer(config)
    spec, plan, trainer, net = model.spec, model.plan, config.trainer, config.network
    horizon = trainer.bptt_horizon + 1
    state_size = model.policy.state_size
    seed = config.run.seed
    messages = make_blocks(config, state_size, seed)
    frames = [encode(m) for m in messages]
    decoded = [decode(f) for f in frames]
    layout = row_layout(spec, horizon=horizon, state_size=state_size)
    sizing = message_sizing(config, layout)
    reference = memory_buffers(layout, plan.segments, decoded)
    mem_buffers = [reference, memory_buffers(layout, plan.segments, decoded)]

    # The obs frame on the wire: index of "obs" among the arrays, + 2 (tag and header frames).
    obs_index = list(messages[0].arrays).index("obs")
    obs_frame = frames[0][2 + obs_index]
    obs_frame_bytes = obs_frame.nbytes if isinstance(obs_frame, memoryview) else len(obs_frame)
    obs_elems = int(np.prod(messages[0].arrays["obs"].shape))
    message_bytes = sum(f.nbytes if isinstance(f, memoryview) else len(f) for f in frames[0])
    common = {"config": config_path, "overrides": overrides, "env": config.env.name,
              "obs_shape": list(spec.obs_shape), "segments": plan.segments, "horizon": trainer.bptt_horizon,
              "batch_size": trainer.batch_size, "gradient_steps": plan.gradient_updates_per_batch,
              "rows_per_message": sizing.rows, "messages_per_batch": len(messages),
              "message_bytes": message_bytes, "hwm": sizing.hwm,
              "torch_threads": config.run.torch_threads}

    stop = threading.Event()
    context = zmq.Context()
    ingest = None
    sender = None
    sender_out = ""
    mem_s = zmq_s = zmq_wait = 0.0
    mem_updates = zmq_updates = 0
    ingest_cpu = 0.0
    ratios: list[float] = []
    matches = None
    try:
        registry = SenderRegistry()
        registry.add(Sender(name="bench-sender", token=BENCH_TOKEN, curve_key=None, num_envs=plan.num_envs,
                            agent_slots=plan.num_envs * spec.num_agents))
        ingest = Ingest(context=context, endpoint="tcp://127.0.0.1:*", segments=plan.segments, env=spec,
                        horizon=horizon, state_size=state_size, max_policy_lag=trainer.max_policy_lag,
                        hwm=sizing.hwm, buffer_bytes=net.socket_buffer_bytes,
                        limits=Limits(max_message_bytes=net.max_message_bytes), stop=stop, registry=registry,
                        rows_per_message=sizing.rows, max_abs_value=net.max_abs_value)
        endpoint = ingest.socket.getsockopt(zmq.LAST_ENDPOINT).decode()
        ingest.start()
        command = [sys.executable, "-m", "ops.bench.ingest", "--sender", endpoint, "--config", config_path,
                   "--state-size", str(state_size), "--seed", str(seed)]
        for item in overrides:
            command += ["--set", item]
        sender = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)

        # Warm-up: first updates (allocator, kernels) on both paths; checks the ingest's batches.
        equal = []

        def same_as_memory(buffers: BatchBuffers) -> None:
            equal.append(all(np.array_equal(array, reference.arrays[name], equal_nan=array.dtype.kind == "f")
                             for name, array in buffers.arrays.items()))

        run_memory(model, mem_buffers, 1)
        run_zmq(model, ingest, 0, 3, check=same_as_memory)  # both buffers, one of them twice
        matches = all(equal)
        for r in range(rounds):
            s = mem_phase = run_memory(model, mem_buffers, updates)
            mem_s += s
            mem_updates += updates
            emit({"benchmark": "ingest_phase", **common, "round": r, "path": "memory", "updates": updates,
                  "s": round(s, 3), "samples_per_s": round(updates * trainer.batch_size / s)})
            cpu0 = thread_cpu_s(ingest)
            s, waited, _ = run_zmq(model, ingest, updates, 1)
            ingest_cpu += thread_cpu_s(ingest) - cpu0
            zmq_s += s
            zmq_wait += waited
            zmq_updates += updates
            ratios.append(mem_phase / s)
            emit({"benchmark": "ingest_phase", **common, "round": r, "path": "zmq", "updates": updates,
                  "s": round(s, 3), "wait_s": round(waited, 3),
                  "samples_per_s": round(updates * trainer.batch_size / s),
                  "ratio_to_memory_phase": round(ratios[-1], 3)})
        totals = ingest.counters.totals()
        stats = {"rows_received": totals.rows_received, "rows_dropped": dict(totals.rows_dropped),
                 "messages_dropped": dict(totals.messages_dropped), "bytes_received": totals.bytes_received}
    finally:
        stop.set()
        if sender is not None:
            if sender.poll() is None:
                sender.terminate()
            try:
                sender_out, _ = sender.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                sender.kill()
                sender_out, _ = sender.communicate()
        if ingest is not None and ingest.is_alive():
            ingest.join(timeout=5)
        if ingest is not None and ingest.is_alive():
            context.destroy(linger=0)
        else:
            context.term()

    sent = None
    for line in (sender_out or "").splitlines():
        if line.startswith("{"):
            sent = json.loads(line).get("messages_sent")
    buffer_obs_dtype = ingest.slots.buffers[0].arrays["obs"].dtype.name
    wire_obs_dtype = decoded[0].arrays["obs"].dtype.name
    dtype_ok = (buffer_obs_dtype == np.dtype(spec.obs_dtype).name and wire_obs_dtype == buffer_obs_dtype
                and obs_frame_bytes == obs_elems * np.dtype(spec.obs_dtype).itemsize)
    emit({"benchmark": "ingest_check", **common, "env_obs_dtype": spec.obs_dtype,
          "ingest_buffer_obs_dtype": buffer_obs_dtype, "wire_obs_dtype": wire_obs_dtype,
          "obs_frame_bytes": obs_frame_bytes, "obs_elements": obs_elems, "obs_dtype_kept": dtype_ok,
          "zmq_batches_equal_memory_batch": matches, **stats, "messages_sent": sent,
          "sender_exit_code": sender.returncode if sender is not None else None})
    assert dtype_ok, "observations changed dtype between the env, the wire and the ingest buffer"
    assert matches, "a batch filled by the ingest thread differs from the in-memory batch"
    assert not stats["messages_dropped"] and not stats["rows_dropped"].get("stale", 0), stats
    memory_sps = mem_updates * trainer.batch_size / mem_s
    zmq_sps = zmq_updates * trainer.batch_size / zmq_s
    ratio = float(np.median(ratios))
    emit({"benchmark": "ingest", "config": config_path, "overrides": overrides,
          "memory_samples_per_s": round(memory_sps), "zmq_samples_per_s": round(zmq_sps),
          "ingest_ratio": round(ratio, 3), "target": TARGET, "meets_target": ratio >= TARGET,
          "ingest_ratio_rounds": [round(r, 3) for r in ratios], "ingest_ratio_totals": round(zmq_sps / memory_sps, 3),
          "updates_per_path": mem_updates, "rounds": rounds, "zmq_wait_s_per_update": round(zmq_wait / zmq_updates, 4),
          "ingest_thread_cpu_s_per_batch": round(ingest_cpu / (zmq_updates + rounds), 4),
          "update_s_memory": round(mem_s / mem_updates, 4), "obs_dtype": buffer_obs_dtype,
          "obs_dtype_kept": dtype_ok})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=None, help="one case (default: the gridworld and cartpole cases)")
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    parser.add_argument("--updates", type=int, default=None, help="timed updates per phase and path")
    parser.add_argument("--rounds", type=int, default=3, help="memory/zmq phase pairs (headline: median ratio)")
    parser.add_argument("--sender", default=None, help=argparse.SUPPRESS)  # internal: run as the sender
    parser.add_argument("--state-size", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sender:
        sender_main(args)
        return
    if args.config:
        cases = [(args.config, args.overrides, args.updates or 4)]
    else:
        cases = [(path, scale + args.overrides, args.updates or updates) for path, scale, updates in DEFAULT_CASES]
    for path, overrides, updates in cases:
        bench_case(path, overrides, updates, args.rounds)


if __name__ == "__main__":
    main()
