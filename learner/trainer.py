"""The learner, wired in one place: control server, ingest, the algorithm's updates, weights, checkpoints,
metrics and stop rules.

Threads: ``control`` (ROUTER, registration and heartbeats), ``ingest`` (PULL, row blocks into the
double-buffered batch), ``metrics-http`` (Prometheus' /metrics and the actor hosts' discovery list) and the main
thread (the update loop: update, publish, checkpoint, log). Stop with SIGINT/SIGTERM: the final checkpoint is
written and actor hosts are told to exit. A run file that cannot be written (a full disk: learner/run/run_files.py) is
one line and the same shutdown, without a final checkpoint, and exit 1.
"""

from __future__ import annotations

import logging
import queue
import signal
import socket
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import torch
import zmq

from envs.registry import probe_env_spec
from configs.loader import config_to_dict
from configs.schema import RunConfig
from learner.serve.addresses import AddressError, binding, learner_addresses, metrics_port
from learner.build import learner_plan, make_algorithm, resolve_device
from learner.update.batch import to_batch
from learner.run.checkpoint import Checkpoint, TrainerState, list_checkpoints, save_checkpoint
from learner.serve.control import ControlCounts, ControlServer
from learner.monitor.evaluation_results import EVALUATION_RESULTS, ResultsTail, evaluation_line, evaluation_metrics
from learner.monitor.evaluator_process import EvaluatorProcess
from learner.monitor.health import ValueHealthMonitor
from learner.update.input_health import SaturationMonitor
from learner.serve.host_sizing import HostSizing
from learner.serve.ingest import Ingest, IngestSnapshot, open_ingest
from learner.pool.store import SnapshotStore
from learner.pool.metrics import PoolMetrics
from learner.pool.server import PoolService
from learner.monitor.progress import ProgressLine, ProgressMode
from learner.monitor.prometheus_metrics import LearnerMetrics, RunCounts
from learner.serve.senders import SenderRegistry
from learner.monitor.metrics_log import MetricsLog
from learner.monitor.metrics_record import Lap, RunClock, metrics_record, outcome_rates
from learner.ranks.distributed import CollectiveTimeout
from learner.serve.host_routing import HostRouting
from learner.ranks.link import RankLink
from learner.ranks.lockstep import LeaderLockstep, RankWaits, rank_wait_metrics
from learner.ranks.context import RankContext, announce_endpoint, gather_endpoints
from learner.update.reducer import SINGLE_PROCESS
from learner.run.resume_point import ResumePoint, pick_checkpoint, settle
from learner.run.run_files import RunFilesError, as_run_files_error
from learner.run.run_record import write_run_record
from learner.monitor.stall_watch import StallRule, StallWatch
from learner.stop_rules import check_stop_rules
from learner.serve.weights import WeightsPublisher
from policies.factory import state_arrays
from protocol import Limits
from protocol.curve import ServerCurve, ZapGuard
from telemetry.exporter import WILDCARD_HOSTS, MetricsBindError, MetricsEndpoint, is_loopback
from telemetry.registry import new_registry

LOG = logging.getLogger("sluice.learner")
DISCOVERY_PATH = "/discovery/actor_hosts"
"""Where the learner's metrics endpoint lists its actor hosts' metrics addresses (Prometheus HTTP SD)."""
SHUTDOWN_GRACE_HEARTBEATS = 3
RANK_GONE_WAIT_S = 4.0
"""After a failed collective, how long rank 0 looks for the rank that is gone before stopping with the error."""


class Learner:
    """Owns every learner component for one run."""

    def __init__(self, config: RunConfig, run_dir: Path, *, resume: bool, curve: ServerCurve | None = None,
                 progress_mode: str = ProgressMode.PLAIN, ranks: RankContext | None = None,
                 resume_from: ResumePoint | None = None) -> None:
        """``progress_mode``: how the console shows progress (learner.monitor.progress.ProgressMode); ``ranks``: rank 0 of a
        data-parallel learner under torchrun (None: the single learner process); ``resume_from``: the checkpoint
        the command line chose (None: the newest intact one)."""
        self.config = config
        self.ranks = ranks
        self.lockstep: LeaderLockstep | None = None
        """Several ranks: waits for the others before each update (learner/ranks/lockstep.py)."""
        self.update_cut_short = False
        """A learner rank failed inside an update: the weights are half-updated and not checkpointed."""
        self.curve = curve
        """CURVE on every socket (None: plaintext, on loopback or with --insecure; see learner_curve)."""
        self.zap: ZapGuard | None = None
        self.run_dir = run_dir
        self.addresses = learner_addresses(config.network)
        torch.set_num_threads(config.run.torch_threads)
        torch.manual_seed(config.run.seed)
        self.device = resolve_device(config.run.device)
        self.spec = probe_env_spec(config.env)
        self.plan = learner_plan(config, ranks)
        checkpoint = self._last_checkpoint(resume_from) if resume else None
        self.state = checkpoint.trainer_state if checkpoint is not None else TrainerState()
        self.algorithm = make_algorithm(config, self.spec, self.plan, device=self.device,
                                        seed=config.run.seed + self.state.update,
                                        reducer=SINGLE_PROCESS if ranks is None else ranks.reducer)
        if checkpoint is not None:
            self.algorithm.load_state_dict(checkpoint.learned)
        if ranks is not None:  # the other ranks start from these weights (learner/follower.py does the same)
            if not resume:
                ranks.board.set_text("resume_from", 0, "")
            ranks.reducer.broadcast_module(self.algorithm.replicated())
        self.stop = threading.Event()
        self.stop_reason = ""
        self.exit_code = 0
        """What run() returns: 0 when a stop rule finished the run, 128 + the signal's number when one stopped it."""
        self.files_failed = False
        """A run file could not be written (learner/run/run_files.py): no final checkpoint, exit 1."""
        self.pool: PoolService | None = None
        self.metrics: MetricsLog | None = None
        self.prometheus = LearnerMetrics(new_registry("learner"))
        """The learner's Prometheus metrics, served at /metrics on network.metrics_port."""
        self.prometheus.set_run(max_policy_lag=config.trainer.max_policy_lag,
                                total_agent_steps=config.trainer.total_timesteps,
                                policy_version=self.state.policy_version)
        self.progress = ProgressLine(total_agent_steps=config.trainer.total_timesteps, mode=progress_mode,
                                     stream=sys.stdout)
        self.value_health = ValueHealthMonitor()
        self.saturation = SaturationMonitor()
        """Warns once when the value head stops explaining returns that vary (learner/monitor/health.py)."""
        self.evaluator = EvaluatorProcess(run_dir, config.evaluation) if config.evaluation.interval_updates else None
        """The child process evaluating pool snapshots against baselines (None: evaluation.interval_updates 0)."""
        self.evaluation_results = ResultsTail(run_dir / EVALUATION_RESULTS)

    def _last_checkpoint(self, point: ResumePoint | None) -> Checkpoint | None:
        """The checkpoint the run continues from: ``point``, else the newest intact one (NoIntactCheckpoint when none
        is); None in a run without one yet. Says what was damaged and moves newer checkpoints aside before anything
        of the run is rewritten (learner/run/resume_point.py)."""
        if point is None and list_checkpoints(self.run_dir):
            point = pick_checkpoint(self.run_dir)
        if self.ranks is not None:  # the other ranks load the same one (learner/follower.py)
            self.ranks.board.set_text("resume_from", 0, "" if point is None else str(point.path.resolve()))
        if point is None:
            return None
        settle(point, say=lambda line: print(line, flush=True))
        LOG.info("resumed from %s (update %d, %d env steps)", point.path.name,
                 point.checkpoint.trainer_state.update, point.checkpoint.trainer_state.env_steps)
        return point.checkpoint

    def _save(self) -> None:
        save_checkpoint(self.run_dir, learned=self.algorithm.state_dict(), state=self.state,
                        keep=self.config.run.keep_checkpoints)

    def request_stop(self, reason: str, *, exit_code: int = 0) -> None:
        """Ask the main loop to finish (stop rules and signal handlers call this); the first request's reason and
        exit code stand."""
        if not self.stop.is_set():
            self.stop_reason = reason
            self.exit_code = exit_code
            self.stop.set()

    def run(self) -> int:
        """Serve and train until done; returns the process exit code."""
        self.pool = self._open_pool()
        context = zmq.Context()
        threads_stop = threading.Event()
        self.zap = None if self.curve is None else ZapGuard(context, self.curve)
        try:
            control, ingest, publisher, endpoint = self._bind(context, threads_stop)
        except AddressError:
            if self.zap is not None:
                self.zap.stop()
            threads_stop.set()
            context.destroy(linger=0)
            raise
        console = write_run_record(self.run_dir)  # provenance: command, git commit, versions, console.log
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl", resumed_at_update=self.state.update)
        policy = self.algorithm.policy
        ingest.policy_version = self.state.policy_version
        ingest.resume_totals(env_steps=self.state.env_steps, agent_steps=self.state.agent_steps,
                             episodes=self.state.episodes, recent_returns=self.state.recent_returns)
        control.set_weights(self.state.policy_version, state_arrays(policy))
        if self.zap is not None:
            for name, sock in (("control", control.socket), ("data", ingest.socket), ("weights", publisher.socket)):
                self.zap.watch(sock, name)
            self.zap.start_watching()
        control.start()
        ingest.start()
        if self.ranks is not None:
            self.lockstep = self._start_ranks(ingest, control, threads_stop)
        addresses = self.addresses
        print(f"learner: {socket.gethostname()} listening on {addresses.control.url} "
              f"(data {addresses.data.url}, weights {addresses.weights.url}, "
              f"{'CURVE' if self.curve is not None else 'plaintext'}); run dir {self.run_dir}", flush=True)
        self._announce_metrics(endpoint)
        try:
            if self.evaluator is not None:
                self.evaluator.start()
            self._train(control, ingest, publisher)
        except (RunFilesError, OSError) as err:
            self._files_failed(err)
        finally:
            if self.evaluator is not None:
                self.evaluator.stop()
            if self.lockstep is not None:
                self.lockstep.end(self.state.update, self.stop_reason or "learner stopping")
            self.progress.close()  # the last update's line, before what the shutdown says
            self._save_final()
            self._shutdown_actors(control, publisher)
            threads_stop.set()
            control.join(timeout=5)
            ingest.join(timeout=5)
            publisher.close()
            endpoint.close()
            if self.zap is not None:
                self.zap.stop()
            context.term()
            self.metrics.close()
            console.close()
        return self.exit_code

    def _bind(self, context: zmq.Context,
              threads_stop: threading.Event) -> tuple[ControlServer, Ingest, WeightsPublisher, MetricsEndpoint]:
        """The control server, the ingest, the weights publisher and the Prometheus endpoint, bound (AddressError
        where one cannot be)."""
        net, addresses = self.config.network, self.addresses
        limits = Limits(max_message_bytes=net.max_message_bytes)
        registration = {
            "config": config_to_dict(self.config),
            "data_endpoint": addresses.data.url,
            "weights_endpoint": addresses.weights.url,
            "run_id": uuid.uuid4().hex,
        }
        registry = SenderRegistry()  # the control server adds and removes senders; the ingest checks rows against it
        routing = None
        if self.ranks is not None:  # every rank's data endpoint, to route actor hosts to
            announce_endpoint(addresses.data, self.ranks)
            routing = HostRouting(gather_endpoints(self.ranks))
        with binding(addresses.control):
            control = ControlServer(context=context, endpoint=addresses.control.url, registration=registration,
                                    peer_timeout_s=net.peer_timeout_s, limits=limits, stop=threads_stop,
                                    registry=registry, sizing=HostSizing(trainer=self.config.trainer,
                                                                         num_agents=self.config.env.num_agents),
                                    pool=self.pool, curve=self.curve, announce=self.progress.event, routing=routing,
                                    zap=self.zap)
        with binding(addresses.data):
            ingest = open_ingest(self.config, self.spec, context=context, endpoint=addresses.data.url,
                                 segments=self.plan.segments, state_size=self.algorithm.policy.state_size,
                                 stop=threads_stop, registry=registry, curve=self.curve, observer=self.prometheus,
                                 pinned=self.device.type == "cuda")
        with binding(addresses.weights):
            publisher = WeightsPublisher(context=context, endpoint=addresses.weights.url, curve=self.curve)
        try:
            endpoint = MetricsEndpoint(host=net.metrics_host, port=metrics_port(net),
                                       registry=self.prometheus.registry,
                                       routes={DISCOVERY_PATH: control.metrics_targets},
                                       setting="--set network.metrics_port=PORT")
        except MetricsBindError as err:
            publisher.close()
            raise AddressError(str(err)) from err
        self.prometheus.watch(RunCounts(ingest=ingest.totals, control=control.counts, clients_refused=self._refused,
                                        ingest_fill=ingest.occupancy, host_heartbeats=control.host_heartbeats))
        return control, ingest, publisher, endpoint

    @staticmethod
    def _announce_metrics(endpoint: MetricsEndpoint) -> None:
        """Say where Prometheus finds the learner and its hosts, with a warning when that is beyond loopback."""
        print(f"learner: Prometheus metrics at {endpoint.url} (actor hosts: "
              f"{endpoint.url.removesuffix('/metrics')}{DISCOVERY_PATH})", flush=True)
        if endpoint.host in WILDCARD_HOSTS or not is_loopback(endpoint.host):
            print(f"learner: warning: /metrics and host discovery bind {endpoint.address}, beyond loopback: plain "
                  "HTTP without authentication, readable by anyone who reaches that address", flush=True)

    def _open_pool(self) -> PoolService | None:
        """With self-play: the run's snapshot store (kept across --resume), seeded with the current weights."""
        section = self.config.selfplay
        if not section.enabled:
            return None
        service = PoolService(SnapshotStore(self.run_dir / "pool"), section, seed=self.config.run.seed,
                              metrics=PoolMetrics(self.prometheus.registry))
        dropped = service.store.truncate_after(self.state.update)  # resumed: they are taken again
        if dropped:
            LOG.info("opponent pool: dropped %d snapshots newer than update %d", dropped, self.state.update)
        if len(service.store) == 0:
            service.add_snapshot(state_arrays(self.algorithm.policy), update=self.state.update,
                                 policy_version=self.state.policy_version)
        LOG.info("opponent pool: %d snapshots in %s", len(service.store), self.run_dir / "pool")
        return service

    def _train(self, control: ControlServer, ingest: Ingest, publisher: WeightsPublisher) -> None:
        """The update loop: every batch the ingest fills becomes one update, until a stop rule or a signal."""
        clock = RunClock(elapsed_before=self.state.elapsed_s, agent_steps=self.state.agent_steps)
        rows_wait_from = time.monotonic()
        stall = StallWatch(StallRule(factor=self.config.run.stall_factor, min_s=self.config.run.stall_min_s),
                           totals=ingest.totals, hosts=control.host_count, filling=lambda: ingest.occupancy()["filling"],
                           say=self.progress.event, gauges=self.prometheus.observe_stall)
        while not self.stop.is_set():
            index = self._wait_for_batch(ingest)
            if self.lockstep is not None:
                self.lockstep.check_followers(self.request_stop)
            if index is None:  # none yet: check for stop requests and stalls again
                stall.waiting()
                continue
            waits = self._wait_for_ranks(own_wait_s=time.monotonic() - rows_wait_from)
            if waits is None:  # stopping: no rank runs this update
                break
            try:
                update_metrics, update_s = self._update(ingest, index)
            except CollectiveTimeout as err:
                self._rank_failed(err)
                break
            rows_wait_from = time.monotonic()
            update_metrics.update(rank_wait_metrics(waits))
            if self.lockstep is not None:
                self.prometheus.observe_rank_waits(waits.rows_wait_s, waits.followers_wait_s)
            self._advance_version(ingest)
            stall.updated()
            weights = self._publish_weights(control, publisher)
            self._snapshot_into_pool(weights)
            counted = ingest.take_snapshot()
            lap = clock.lap(counted.agent_steps)
            self._update_counters(counted, lap)
            self._write_metrics(counted, update_metrics, lap, hosts=control.counts(), update_s=update_s)
            self._checkpoint_on_interval()
            self._apply_stop_rules()

    def _start_ranks(self, ingest: Ingest, control: ControlServer, threads_stop: threading.Event) -> LeaderLockstep:
        """Rank 0 of several: the thread to the other ranks (heartbeats, registered hosts) and the lockstep."""
        assert self.ranks is not None and control.routing is not None
        link = RankLink(self.ranks, control.registry, fill=lambda: ingest.occupancy()["filling"], stop=threads_stop)
        link.start()
        return LeaderLockstep(self.ranks, link, stats=ingest.stats, routing=control.routing,
                              announce=self.progress.event, observe_fills=self.prometheus.observe_rank_fills)

    def _wait_for_ranks(self, *, own_wait_s: float) -> RankWaits | None:
        """Several ranks: wait until every rank has its batch and tell them all to update (None: stop instead);
        one rank: nothing to wait for."""
        if self.lockstep is None:
            return RankWaits(rows_wait_s={0: own_wait_s}, followers_wait_s=0.0)
        waits = self.lockstep.wait_for_followers(self.state.update, stop=self.stop, request_stop=self.request_stop,
                                                 own_wait_s=own_wait_s)
        if waits is not None:
            self.lockstep.go(self.state.update)
        return waits

    def _rank_failed(self, error: CollectiveTimeout) -> None:
        """A collective failed mid-update: name the rank that is gone (when it can be told) and stop."""
        assert self.lockstep is not None
        gone = self.lockstep.link.gone()
        deadline = time.monotonic() + RANK_GONE_WAIT_S
        while not gone and time.monotonic() < deadline:
            time.sleep(0.1)
            gone = self.lockstep.link.gone()
        self.update_cut_short = True
        self.request_stop("; ".join(gone) if gone else str(error), exit_code=1)

    def _save_final(self) -> None:
        """The final checkpoint, unless a rank failure cut the last update short (its weights are half-updated;
        the previous checkpoint stands)."""
        if self.update_cut_short:
            self.progress.event(f"learner: no final checkpoint (update {self.state.update} was cut short by a "
                                "learner rank failure); --resume continues from the last one")
            return
        if not self.files_failed:
            try:
                self._save()
            except RunFilesError as err:
                self._files_failed(err)

    def _files_failed(self, err: OSError | RunFilesError) -> None:
        """A run file cannot be written (a disk error; any other OSError propagates): one line naming it, then the
        same shutdown as SIGTERM without a final checkpoint (the last good one stands), and exit 1."""
        error = err if isinstance(err, RunFilesError) else as_run_files_error(err, self.run_dir)
        if error is None:
            raise err
        if not self.files_failed:
            self.progress.event(f"learner: {error}; stopping")
        self.files_failed = True
        self.request_stop("the run directory cannot be written", exit_code=1)
        self.exit_code = 1

    @staticmethod
    def _wait_for_batch(ingest: Ingest) -> int | None:
        """The index of a filled batch buffer, or None after a short wait (the ingest's failure is raised)."""
        if ingest.error is not None:
            raise RuntimeError("ingest thread failed") from ingest.error
        try:
            return ingest.ready.get(timeout=0.2)
        except queue.Empty:
            return None

    def _update(self, ingest: Ingest, index: int) -> tuple[dict[str, float], float]:
        """The algorithm's update on batch buffer ``index``, which then goes back to the ingest; returns the
        update's metrics and its seconds."""
        started = time.monotonic()
        update_metrics = self.algorithm.update(to_batch(ingest.buffers[index], self.device),
                                               update_index=self.state.update)
        ingest.free.put(index)
        return update_metrics, time.monotonic() - started

    def _advance_version(self, ingest: Ingest) -> None:
        """One more update done: a new policy version, which the ingest measures rows' lag against."""
        self.state.update += 1
        self.state.policy_version += 1
        ingest.policy_version = self.state.policy_version

    def _publish_weights(self, control: ControlServer, publisher: WeightsPublisher) -> dict[str, np.ndarray]:
        """Send the new weights to subscribed actor hosts and hand them to the control server (for hosts that
        register or ask); returns them as arrays."""
        weights = state_arrays(self.algorithm.policy)
        publisher.publish(self.state.policy_version, weights)
        control.set_weights(self.state.policy_version, weights)
        return weights

    def _snapshot_into_pool(self, weights: dict[str, np.ndarray]) -> None:
        """Self-play: every snapshot_interval updates the current weights join the opponent pool."""
        if self.pool is not None and self.state.update % self.config.selfplay.snapshot_interval == 0:
            self.pool.add_snapshot(weights, update=self.state.update, policy_version=self.state.policy_version)

    def _update_counters(self, counted: IngestSnapshot, lap: Lap) -> None:
        """The run's counters (what a checkpoint keeps and stop rules read) from the ingest's and the clock."""
        self.state.env_steps = counted.env_steps
        self.state.agent_steps = counted.agent_steps
        self.state.episodes = counted.episodes
        self.state.recent_returns = list(counted.recent_returns)
        self.state.elapsed_s = lap.elapsed_s

    def _write_metrics(self, counted: IngestSnapshot, update_metrics: dict[str, float], lap: Lap, *,
                       hosts: ControlCounts, update_s: float) -> None:
        """One metrics.jsonl record and console line for the update just done."""
        selfplay = {} if self.pool is None else {**self.pool.take_stats(), **outcome_rates(counted.recent_returns)}
        record = metrics_record(state=self.state, sps=lap.steps_per_s, ingest=counted, update_metrics=update_metrics,
                                hosts=hosts, selfplay=selfplay, update_s=update_s,
                                clients_refused=self._refused())
        record.update(self._read_evaluations())
        self.metrics.write(record)
        self.prometheus.observe_update(record=record, update_metrics=update_metrics, update_s=update_s,
                                       samples=self.plan.segments * self.config.trainer.bptt_horizon
                                       * (1 if self.ranks is None else self.ranks.world_size))
        health = self.value_health.observe(explained_variance=update_metrics.get("explained_variance"),
                                           episode_returns=counted.recent_returns)
        self.prometheus.observe_value_health(health)
        if health.warning is not None:
            LOG.warning("%s", health.warning)
        saturation = self.saturation.observe(update_metrics.get("first_layer_frozen_frac"))
        if saturation.warning is not None:
            LOG.warning("%s", saturation.warning)
        self.progress.update(record)

    def _read_evaluations(self) -> dict[str, float]:
        """The evaluations the child reported since the last update: a console line and Prometheus gauges each; the
        newest one's figures for this update's record (none without a new evaluation)."""
        if self.evaluator is None:
            return {}
        if not self.stop.is_set():
            self.evaluator.check()
        figures: dict[str, float] = {}
        for record in self.evaluation_results.read_new():
            self.progress.event(evaluation_line(record))
            figures = evaluation_metrics(record)
            self.prometheus.observe_evaluation(figures)
        return figures

    def _refused(self) -> int:
        """CURVE connection attempts refused so far (0 without CURVE)."""
        return 0 if self.zap is None else self.zap.refused()

    def _checkpoint_on_interval(self) -> None:
        if self.state.update % self.config.run.checkpoint_interval == 0:
            self._save()

    def _apply_stop_rules(self) -> None:
        decision = check_stop_rules(self.config.trainer, self.state)
        if decision is not None:
            self.progress.event(decision.announcement)
            self.request_stop(decision.reason)

    def _shutdown_actors(self, control: ControlServer, publisher: WeightsPublisher) -> None:
        """Tell actor hosts to exit, and give them a few heartbeats to hear it and say goodbye."""
        reason = self.stop_reason or "learner stopping"
        control.begin_shutdown(reason)
        deadline = time.monotonic() + SHUTDOWN_GRACE_HEARTBEATS * self.config.network.heartbeat_interval_s
        while time.monotonic() < deadline and control.host_count() > 0:
            publisher.publish_shutdown(reason)
            time.sleep(0.1)
        kept = "last" if self.update_cut_short or self.files_failed else "final"
        self.progress.event(f"learner: stopped ({reason}); {kept} checkpoint in {self.run_dir / 'checkpoints'}")


def install_signal_handlers(learner: Learner) -> None:
    """SIGINT/SIGTERM ask the learner to stop cleanly; the process then exits with 128 + the signal's number (130,
    143), the shell's convention for a process a signal ended, so an interrupted run is told from a finished one."""
    def handler(signum: int, _frame: object) -> None:
        learner.request_stop(f"{signal.Signals(signum).name} received", exit_code=128 + signum)
    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
