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
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import numpy as np
import zmq

from configs.schema import RunConfig
from learner.serve.addresses import AddressError, learner_addresses
from learner.build import build_learner
from learner.update.batch import to_batch
from learner.run.checkpoint import TrainerState, list_checkpoints, save_checkpoint
from learner.monitor.evaluation_results import EVALUATION_RESULTS, ResultsTail
from learner.monitor.evaluator_process import EvaluatorProcess
from learner.serve.ingest import Ingest
from learner.serve.serving import Serving, bind_serving
from learner.serve.ingest_counters import IngestSnapshot
from learner.pool.metrics import PoolMetrics
from learner.pool.server import PoolService, open_run_pool
from learner.monitor.progress import ProgressLine, ProgressMode
from learner.monitor.prometheus_metrics import LearnerMetrics, RunCounts
from learner.monitor.metrics_log import MetricsLog
from learner.monitor.metrics_record import Lap, RunClock, outcome_rates
from learner.monitor.tracking import Tracking, check_tracking
from learner.monitor.update_report import UpdateReport
from learner.monitor.metrics_endpoint import announce_metrics, open_metrics_endpoint
from learner.ranks.distributed import CollectiveTimeout
from learner.serve.host_routing import HostRouting
from learner.ranks.lockstep import LeaderLockstep, RankWaits, rank_wait_metrics
from learner.ranks.context import RankContext, announce_endpoint, gather_endpoints, gather_ipc_routes
from learner.run.resume_point import ResumePoint, resume_checkpoint
from learner.run.run_files import RunFilesError, as_run_files_error
from learner.run.run_record import write_run_record
from learner.monitor.stall_watch import StallRule, StallWatch
from learner.stop_rules import check_stop_rules
from policies.factory import state_arrays
from protocol.curve import ServerCurve, ZapGuard
from telemetry.exporter import MetricsEndpoint
from telemetry.registry import new_registry

LOG = logging.getLogger("sluice.learner")
SHUTDOWN_GRACE_HEARTBEATS = 3


class Learner:
    """Owns every learner component for one run."""

    def __init__(self, config: RunConfig, run_dir: Path, *, resume: bool, curve: ServerCurve | None = None,
                 progress_mode: str = ProgressMode.PLAIN, ranks: RankContext | None = None,
                 resume_from: ResumePoint | None = None) -> None:
        """``progress_mode``: how the console shows progress (learner.monitor.progress.ProgressMode); ``ranks``: rank 0 of a
        data-parallel learner under torchrun (None: the single learner process); ``resume_from``: the checkpoint
        the command line chose (None: the newest intact one)."""
        check_tracking(config.run)  # W&B / MLflow switched on but not installed: one line, before anything starts
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
        setup = build_learner(config, ranks, resume=lambda: resume_checkpoint(run_dir, resume=resume, point=resume_from,
                                                                               chosen=self._announce_resume))
        self.device, self.spec, self.plan, self.algorithm = setup.device, setup.spec, setup.plan, setup.algorithm
        self.state = setup.checkpoint.trainer_state if setup.checkpoint is not None else TrainerState()
        self.resumed = setup.checkpoint is not None
        self.stop = threading.Event()
        self.stop_reason = ""
        self.exit_code = 0
        """What run() returns: 0 when a stop rule finished the run, 128 + the signal's number when one stopped it."""
        self.files_failed = False
        """A run file could not be written (learner/run/run_files.py): no final checkpoint, exit 1."""
        self.pool: PoolService | None = None
        self.prometheus = LearnerMetrics(new_registry("learner"))
        """The learner's Prometheus metrics, served at /metrics on network.metrics_port."""
        self.prometheus.set_run(max_policy_lag=config.trainer.max_policy_lag,
                                total_agent_steps=config.trainer.total_timesteps,
                                policy_version=self.state.policy_version)
        self.progress = ProgressLine(total_agent_steps=config.trainer.total_timesteps, mode=progress_mode,
                                     stream=sys.stdout)
        self.evaluator = EvaluatorProcess(run_dir, config.evaluation) if config.evaluation.interval_updates else None
        """The child process evaluating pool snapshots against baselines (None: evaluation.interval_updates 0)."""

    def _announce_resume(self, path: Path | None) -> None:
        """Several ranks: the others load the same checkpoint (learner/follower.py); "" for a fresh run."""
        if self.ranks is not None:
            self.ranks.board.set_text("resume_from", 0, "" if path is None else str(path.resolve()))

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
        if self.config.selfplay.enabled:  # the run's snapshot store, kept across --resume
            self.pool = open_run_pool(self.run_dir / "pool", self.config.selfplay, seed=self.config.run.seed,
                                      metrics=PoolMetrics(self.prometheus.registry),
                                      weights=state_arrays(self.algorithm.policy), update=self.state.update,
                                      policy_version=self.state.policy_version)
        context = zmq.Context()
        threads_stop = threading.Event()
        self.zap = None if self.curve is None else ZapGuard(context, self.curve)
        try:
            serving, endpoint = self._bind(context, threads_stop)
        except AddressError:
            if self.zap is not None:
                self.zap.stop()
            threads_stop.set()
            context.destroy(linger=0)
            raise
        control, ingest, publisher = serving.control, serving.ingest, serving.publisher
        console = write_run_record(self.run_dir)  # provenance: command, git commit, versions, console.log
        console.hold_status_line(self.progress)  # logging clears the live line; progress lines go into console.log
        metrics = MetricsLog(self.run_dir / "metrics.jsonl", resumed_at_update=self.state.update)
        report = UpdateReport(metrics=metrics, progress=self.progress, prometheus=self.prometheus,
                              evaluator=self.evaluator, evaluations=ResultsTail(self.run_dir / EVALUATION_RESULTS),
                              samples_per_update=self.plan.segments * self.config.trainer.bptt_horizon
                              * (1 if self.ranks is None else self.ranks.world_size),
                              tracking=Tracking.start(self.config, self.run_dir, resume=self.resumed,
                                                      say=self.progress.event))
        policy = self.algorithm.policy
        ingest.set_policy_version(self.state.policy_version)
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
            assert control.routing is not None
            self.lockstep = LeaderLockstep.start(self.ranks, counters=ingest.counters, registry=control.registry,
                                                 routing=control.routing, fill=lambda: ingest.occupancy()["filling"],
                                                 stop=threads_stop, announce=self.progress.event,
                                                 observe_fills=self.prometheus.observe_rank_fills)
        addresses = self.addresses
        print(f"learner: {socket.gethostname()} listening on {addresses.control.url} "
              f"(data {addresses.data.url}, weights {addresses.weights.url}, "
              f"{'CURVE' if self.curve is not None else 'plaintext'}); run dir {self.run_dir}", flush=True)
        announce_metrics(endpoint)
        try:
            if self.evaluator is not None:
                self.evaluator.start()
            self._train(serving, report)
        except (RunFilesError, OSError) as err:
            self._files_failed(err)
        finally:
            if self.evaluator is not None:
                self.evaluator.stop()
            if self.lockstep is not None:
                self.lockstep.end(self.state.update, self.stop_reason or "learner stopping")
            self.progress.close()  # the last update's line, before what the shutdown says
            self._save_final()
            self._shutdown_actors(serving)
            threads_stop.set()
            control.join(timeout=5)
            ingest.join(timeout=5)
            publisher.close()
            endpoint.close()
            if self.zap is not None:
                self.zap.stop()
            context.term()
            report.metrics.close()
            self._finish_tracking(report.tracking)
            console.close()
        return self.exit_code

    def _bind(self, context: zmq.Context, threads_stop: threading.Event) -> tuple[Serving, MetricsEndpoint]:
        """The learner's sockets and the Prometheus endpoint, bound (AddressError where one cannot be)."""
        routing, rank_ipc = None, None
        if self.ranks is not None:  # every rank's data endpoint (and ipc route), to route actor hosts to
            announce_endpoint(self.addresses.data, self.ranks)
            endpoints = gather_endpoints(self.ranks)
            routing, rank_ipc = HostRouting(endpoints), gather_ipc_routes(self.ranks, endpoints)
        serving = bind_serving(self.config, self.spec, self.addresses, context=context, stop=threads_stop,
                               segments=self.plan.segments, state_size=self.algorithm.policy.state_size,
                               pool=self.pool, curve=self.curve, zap=self.zap, announce=self.progress.event,
                               observer=self.prometheus, routing=routing, pinned=self.device.type == "cuda",
                               rank_ipc=rank_ipc)
        try:
            endpoint = open_metrics_endpoint(self.config.network, self.prometheus,
                                             host_targets=serving.control.metrics_targets)
        except AddressError:
            serving.publisher.close()
            raise
        self.prometheus.watch(RunCounts(ingest=serving.ingest.counters.totals, control=serving.control.counts,
                                        clients_refused=self._refused, ingest_fill=serving.ingest.occupancy,
                                        host_heartbeats=serving.control.host_heartbeats))
        return serving, endpoint

    def _train(self, serving: Serving, report: UpdateReport) -> None:
        """The update loop: every batch the ingest fills becomes one update, until a stop rule or a signal."""
        control, ingest = serving.control, serving.ingest
        clock = RunClock(elapsed_before=self.state.elapsed_s, agent_steps=self.state.agent_steps)
        rows_wait_from = time.monotonic()
        stall = StallWatch(StallRule(factor=self.config.run.stall_factor, min_s=self.config.run.stall_min_s),
                           totals=ingest.counters.totals, hosts=control.host_count,
                           filling=lambda: ingest.occupancy()["filling"],
                           say=self.progress.event, gauges=self.prometheus.observe_stall)
        while not self.stop.is_set():
            self.progress.hosts(control.host_count())  # "waiting for actor hosts" once the last one has gone
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
            except CollectiveTimeout as err:  # a rank is gone mid-update: its weights are half-updated
                assert self.lockstep is not None
                self.update_cut_short = True
                self.request_stop(self.lockstep.failure_reason(err), exit_code=1)
                break
            rows_wait_from = time.monotonic()
            update_metrics.update(rank_wait_metrics(waits))
            if self.lockstep is not None:
                self.prometheus.observe_rank_waits(waits.rows_wait_s, waits.followers_wait_s)
            self._advance_version(ingest)
            stall.updated()
            weights = state_arrays(self.algorithm.policy)
            serving.publish_weights(self.state.policy_version, weights)
            self._snapshot_into_pool(weights)
            counted = ingest.counters.take_snapshot()
            lap = clock.lap(counted.agent_steps)
            self._update_counters(counted, lap)
            selfplay = {} if self.pool is None else {**self.pool.take_stats(), **outcome_rates(counted.recent_returns)}
            report.write(state=self.state, counted=counted, update_metrics=update_metrics, lap=lap,
                         hosts=control.counts(), update_s=update_s, selfplay=selfplay,
                         clients_refused=self._refused(), stopping=self.stop.is_set())
            self._checkpoint_on_interval()
            self._apply_stop_rules()

    def _wait_for_ranks(self, *, own_wait_s: float) -> RankWaits | None:
        """Several ranks: wait until every rank has its batch and tell them all to update (None: stop instead);
        one rank: nothing to wait for."""
        if self.lockstep is None:
            return RankWaits(rows_wait_s={0: own_wait_s}, followers_wait_s=0.0)
        return self.lockstep.next_update(self.state.update, stop=self.stop, request_stop=self.request_stop,
                                         own_wait_s=own_wait_s)

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

    def _finish_tracking(self, tracking: Tracking) -> None:
        """W&B / MLflow: the newest intact checkpoint (the final one, unless none could be written) as an artifact,
        then their runs closed with the run's exit code (a failure there is a warning: learner/monitor/tracking.py)."""
        try:
            checkpoints = list_checkpoints(self.run_dir)
        except OSError:
            checkpoints = []
        tracking.finish(checkpoint=checkpoints[-1] if checkpoints else None, exit_code=self.exit_code)

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
        return ingest.slots.next_full(timeout=0.2)

    def _update(self, ingest: Ingest, index: int) -> tuple[dict[str, float], float]:
        """The algorithm's update on batch buffer ``index``, which then goes back to the ingest; returns the
        update's metrics and its seconds."""
        started = time.monotonic()
        update_metrics = self.algorithm.update(to_batch(ingest.slots.buffers[index], self.device),
                                               update_index=self.state.update)
        ingest.slots.release(index)
        return update_metrics, time.monotonic() - started

    def _advance_version(self, ingest: Ingest) -> None:
        """One more update done: a new policy version, which the ingest measures rows' lag against."""
        self.state.update += 1
        self.state.policy_version += 1
        ingest.set_policy_version(self.state.policy_version)

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

    def _shutdown_actors(self, serving: Serving) -> None:
        """Tell actor hosts to exit, and give them a few heartbeats to hear it and say goodbye."""
        reason = self.stop_reason or "learner stopping"
        serving.shut_down_hosts(reason, grace_s=SHUTDOWN_GRACE_HEARTBEATS * self.config.network.heartbeat_interval_s)
        kept = "last" if self.update_cut_short or self.files_failed else "final"
        self.progress.event(f"learner: stopped ({reason}); {kept} checkpoint in {self.run_dir / 'checkpoints'}")


def install_signal_handlers(learner: Learner) -> None:
    """SIGINT/SIGTERM ask the learner to stop cleanly; the process then exits with 128 + the signal's number (130,
    143), the shell's convention for a process a signal ended, so an interrupted run is told from a finished one."""
    def handler(signum: int, _frame: object) -> None:
        learner.request_stop(f"{signal.Signals(signum).name} received", exit_code=128 + signum)
    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
