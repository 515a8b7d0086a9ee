"""The learner, wired in one place: control server, ingest, PPO updates, weights, checkpoints, metrics.

Threads: ``control`` (ROUTER, registration and heartbeats), ``ingest`` (PULL, row blocks into the
double-buffered batch) and the main thread (train, publish, checkpoint, log). Stop with SIGINT/SIGTERM:
the final checkpoint is written and actor hosts are told to exit.
"""

from __future__ import annotations

import copy
import logging
import queue
import signal
import socket
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import torch
import zmq

from envs.registry import env_spec
from configs.loader import config_to_dict
from configs.plan import make_plan
from configs.schema import RunConfig, TrainerSection
from learner.checkpoint import TrainerState, list_checkpoints, load_checkpoint, save_checkpoint
from learner.control import ControlServer
from learner.ingest import BatchBuffers, Ingest, host_timing
from learner.pool import SnapshotStore
from learner.pool_server import PoolService
from learner.metrics_log import MetricsLog
from learner.losses import minibatch_losses
from learner.ppo import RowBatch, ppo_update
from learner.schedules import schedule_for
from learner.weights import WeightsPublisher
from policies.factory import make_policy, state_arrays
from protocol import Limits
from protocol.endpoints import parse_endpoint

LOG = logging.getLogger("sluice.learner")
SHUTDOWN_GRACE_HEARTBEATS = 3


def resolve_device(name: str) -> torch.device:
    """auto -> cuda when available, else cpu; cuda without a GPU is an error."""
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("run.device is 'cuda' but torch sees no CUDA device; use 'auto' or 'cpu'")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def to_batch(buffers: BatchBuffers, device: torch.device) -> RowBatch:
    """Host batch -> device tensors (obs keeps its env dtype; the model casts)."""
    a = buffers.arrays
    pin = device.type == "cuda"

    def move(array: np.ndarray, dtype: torch.dtype | None = None) -> torch.Tensor:
        tensor = torch.from_numpy(array)
        if pin:
            tensor = tensor.pin_memory()
        tensor = tensor.to(device, non_blocking=pin)
        return tensor if dtype is None else tensor.to(dtype)

    actions = move(a["actions"])
    actions = actions.to(torch.int64) if actions.dtype == torch.int32 else actions
    return RowBatch(obs=move(a["obs"]), actions=actions, action_masks=move(a["action_masks"]),
                    logprobs=move(a["logprobs"]),
                    values=move(a["values"]), rewards=move(a["rewards"]),
                    dones=move(a["dones"], torch.float32), bootstrap=move(a["bootstrap"]),
                    states=move(a["states"]))


def make_optimizer(policy: torch.nn.Module, trainer: TrainerSection) -> torch.optim.Optimizer:
    """Adam or AdamW (seeds/003) with the configured epsilon and weight decay."""
    kind = torch.optim.AdamW if trainer.optimizer == "adamw" else torch.optim.Adam
    return kind(policy.parameters(), lr=trainer.learning_rate, eps=trainer.adam_eps,
                weight_decay=trainer.weight_decay)


def zero_value_head(policy: torch.nn.Module) -> None:
    """zero_initial_vf (seeds/003): the value head starts at exactly 0."""
    with torch.no_grad():
        policy.critic.weight.zero_()
        policy.critic.bias.zero_()


def make_reference(policy: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of the policy for the KL penalty."""
    reference = copy.deepcopy(policy)
    reference.requires_grad_(False)
    return reference


class Learner:
    """Owns every learner component for one run."""

    def __init__(self, config: RunConfig, run_dir: Path, *, resume: bool) -> None:
        self.config = config
        self.run_dir = run_dir
        torch.set_num_threads(config.run.torch_threads)
        torch.manual_seed(config.run.seed)
        self.device = resolve_device(config.run.device)
        self.spec = env_spec(config.env)
        self.plan = make_plan(config.trainer, num_agents=config.env.num_agents)
        trainer = config.trainer
        self.policy = make_policy(self.spec, config.model).to(self.device)
        if trainer.zero_initial_vf:
            zero_value_head(self.policy)
        self.optimizer = make_optimizer(self.policy, trainer)
        self.reference = make_reference(self.policy) if trainer.kl_divergence_coef_rho > 0 else None
        self.loss_fn = (torch.compile(minibatch_losses, mode=trainer.compile_mode) if trainer.compile
                        else minibatch_losses)
        self.state = TrainerState()
        if resume:
            checkpoints = list_checkpoints(run_dir)
            if checkpoints:
                self.state = load_checkpoint(checkpoints[-1], policy=self.policy, optimizer=self.optimizer,
                                             reference=self.reference)
                LOG.info("resumed from %s (update %d, %d env steps)", checkpoints[-1].name,
                         self.state.update, self.state.env_steps)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(config.run.seed + self.state.update)
        self.stop = threading.Event()
        self.stop_reason = ""
        self.metrics = MetricsLog(run_dir / "metrics.jsonl")

    def _save(self) -> None:
        save_checkpoint(self.run_dir, policy=self.policy, optimizer=self.optimizer, state=self.state,
                        keep=self.config.run.keep_checkpoints, reference=self.reference)

    def request_stop(self, reason: str) -> None:
        """Ask the main loop to finish (signal handlers call this)."""
        if not self.stop.is_set():
            self.stop_reason = reason
            self.stop.set()

    def run(self) -> int:
        """Serve and train until done; returns the process exit code."""
        net = self.config.network
        control_ep = parse_endpoint(f"tcp://{net.host}:{net.port}")
        data_ep, weights_ep = control_ep.with_port(net.port + 1), control_ep.with_port(net.port + 2)
        limits = Limits(max_message_bytes=net.max_message_bytes)
        context = zmq.Context()
        threads_stop = threading.Event()
        registration = {
            "config": config_to_dict(self.config),
            "data_endpoint": data_ep.url,
            "weights_endpoint": weights_ep.url,
            "run_id": uuid.uuid4().hex,
        }
        self.pool = self._open_pool()
        control = ControlServer(context=context, endpoint=control_ep.url, registration=registration,
                                peer_timeout_s=net.peer_timeout_s, limits=limits, stop=threads_stop, pool=self.pool)
        ingest = Ingest(context=context, endpoint=data_ep.url, segments=self.plan.segments, env=self.spec,
                        horizon=self.config.trainer.bptt_horizon + 1, state_size=self.policy.state_size,
                        max_policy_lag=self.config.trainer.max_policy_lag,
                        hwm=net.send_queue_messages, buffer_bytes=net.socket_buffer_bytes, limits=limits,
                        stop=threads_stop)
        publisher = WeightsPublisher(context=context, endpoint=weights_ep.url)
        ingest.policy_version = self.state.policy_version
        control.set_weights(self.state.policy_version, state_arrays(self.policy))
        control.start()
        ingest.start()
        print(f"learner: {socket.gethostname()} listening on {control_ep.url} "
              f"(data {data_ep.url}, weights {weights_ep.url}); run dir {self.run_dir}", flush=True)
        exit_code = 0
        try:
            exit_code = self._train(control, ingest, publisher)
        finally:
            self._save()
            self._shutdown_actors(control, publisher)
            threads_stop.set()
            control.join(timeout=5)
            ingest.join(timeout=5)
            publisher.close()
            context.term()
            self.metrics.close()
        return exit_code

    def _open_pool(self) -> PoolService | None:
        """With self-play: the run's snapshot store (kept across --resume), seeded with the current weights."""
        section = self.config.selfplay
        if not section.enabled:
            return None
        service = PoolService(SnapshotStore(self.run_dir / "pool"), section, seed=self.config.run.seed)
        dropped = service.store.truncate_after(self.state.update)  # resumed: they are taken again
        if dropped:
            LOG.info("opponent pool: dropped %d snapshots newer than update %d", dropped, self.state.update)
        if len(service.store) == 0:
            service.add_snapshot(state_arrays(self.policy), update=self.state.update,
                                 policy_version=self.state.policy_version)
        LOG.info("opponent pool: %d snapshots in %s", len(service.store), self.run_dir / "pool")
        return service

    def _selfplay_metrics(self, returns: list[float]) -> dict:
        """The pool's figures, and the learner's win/draw/loss against it (sign of its last returns)."""
        if self.pool is None:
            return {}
        outcome = np.sign(np.asarray(returns, dtype=np.float64))
        rates = {name: float((outcome == sign).mean()) if len(outcome) else None
                 for name, sign in (("win_rate", 1), ("draw_rate", 0), ("loss_rate", -1))}
        return {**self.pool.take_stats(), **rates}

    def _train(self, control: ControlServer, ingest: Ingest, publisher: WeightsPublisher) -> int:
        trainer, plan = self.config.trainer, self.plan
        started = time.monotonic()
        elapsed_before = self.state.elapsed_s
        last_steps, last_time = self.state.agent_steps, started
        stats = ingest.stats
        with stats.lock:
            stats.env_steps = self.state.env_steps
            stats.agent_steps = self.state.agent_steps
            stats.episodes = self.state.episodes
            stats.recent_returns.extend(self.state.recent_returns)
        while not self.stop.is_set():
            if ingest.error is not None:
                raise RuntimeError("ingest thread failed") from ingest.error
            try:
                index = ingest.ready.get(timeout=0.2)
            except queue.Empty:  # keep checking for stop requests
                continue
            batch = to_batch(ingest.buffers[index], self.device)
            schedule = schedule_for(trainer, self.state.update, plan.total_epochs)
            update_started = time.monotonic()
            metrics = ppo_update(self.policy, self.optimizer, batch, trainer=trainer, plan=plan,
                                 schedule=schedule, generator=self.generator, reference=self.reference,
                                 loss_fn=self.loss_fn)
            ingest.free.put(index)
            update_s = time.monotonic() - update_started
            self.state.update += 1
            self.state.policy_version += 1
            if (self.reference is not None and trainer.enable_ref_update
                    and self.state.update % trainer.ref_update_interval == 0):
                self.reference.load_state_dict(self.policy.state_dict())
            ingest.policy_version = self.state.policy_version
            weights = state_arrays(self.policy)
            publisher.publish(self.state.policy_version, weights)
            if self.pool is not None and self.state.update % self.config.selfplay.snapshot_interval == 0:
                self.pool.add_snapshot(weights, update=self.state.update, policy_version=self.state.policy_version)
            control.set_weights(self.state.policy_version, weights)

            now = time.monotonic()
            with stats.lock:
                self.state.env_steps = stats.env_steps
                self.state.agent_steps = stats.agent_steps
                self.state.episodes = stats.episodes
                env_restarts = stats.env_restarts
                named = {f"episode_{name}_mean": float(np.mean(values)) if values else None
                         for name, values in stats.recent_stats.items()}
                self.state.recent_returns = list(stats.recent_returns)
                lengths = list(stats.recent_lengths)
                lag_mean = stats.lag_sum / max(1, stats.lag_rows)
                lag_max = stats.lag_max
                stats.lag_sum = stats.lag_max = stats.lag_rows = 0
                dropped_stale = stats.rows_dropped["stale"]
                dropped_future = stats.rows_dropped["future"]
                dropped_messages = sum(stats.messages_dropped.values())
                timing = host_timing(stats.host_stats)
                stats.host_stats.clear()
            self.state.elapsed_s = elapsed_before + now - started
            returns = self.state.recent_returns
            record = {
                "update": self.state.update,
                "env_steps": self.state.env_steps,
                "agent_steps": self.state.agent_steps,
                "sps": (self.state.agent_steps - last_steps) / max(1e-9, now - last_time),
                "elapsed_s": self.state.elapsed_s,
                "episodes": self.state.episodes,
                "episode_return_mean": float(np.mean(returns)) if returns else None,
                "episode_length_mean": float(np.mean(lengths)) if lengths else None,
                **named,
                **metrics,
                "policy_version": self.state.policy_version,
                "policy_lag_mean": lag_mean,
                "policy_lag_max": lag_max,
                "rows_dropped_stale": dropped_stale,
                "rows_dropped_future": dropped_future,
                "messages_dropped": dropped_messages,
                "env_restarts": env_restarts,
                "actor_hosts": control.host_count(),
                **timing,
                **self._selfplay_metrics(returns),
                "update_s": update_s,
            }
            last_steps, last_time = self.state.agent_steps, now
            self.metrics.write(record)
            if self.state.update % self.config.run.checkpoint_interval == 0:
                self._save()
            target = trainer.target_episode_return
            if target is not None and len(returns) >= 100 and np.mean(returns) >= target:
                print(f"learner: solved: mean return {np.mean(returns):.1f} over the last 100 episodes "
                      f">= {target:g} after {self.state.agent_steps:,} agent steps in "
                      f"{self.state.elapsed_s:.1f} s ({self.state.update} updates)", flush=True)
                self.request_stop("target return reached")
            elif self.state.agent_steps >= trainer.total_timesteps:
                print(f"learner: reached total_timesteps ({self.state.agent_steps:,} agent steps) in "
                      f"{self.state.elapsed_s:.1f} s", flush=True)
                self.request_stop("total_timesteps reached")
        return 0

    def _shutdown_actors(self, control: ControlServer, publisher: WeightsPublisher) -> None:
        """Tell actor hosts to exit, and give them a few heartbeats to hear it and say goodbye."""
        reason = self.stop_reason or "learner stopping"
        control.begin_shutdown(reason)
        deadline = time.monotonic() + SHUTDOWN_GRACE_HEARTBEATS * self.config.network.heartbeat_interval_s
        while time.monotonic() < deadline and control.host_count() > 0:
            publisher.publish_shutdown(reason)
            time.sleep(0.1)
        print(f"learner: stopped ({reason}); final checkpoint in {self.run_dir / 'checkpoints'}", flush=True)


def install_signal_handlers(learner: Learner) -> None:
    """SIGINT/SIGTERM ask the learner to stop cleanly."""
    def handler(signum: int, _frame: object) -> None:
        learner.request_stop(f"{signal.Signals(signum).name} received")
    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
