"""An actor host, built in one place: ``build_host`` makes every part and connects them, in data-flow order.

    learner --REGISTERED--> config, weights --> Inference
    WorkerPool --ready GroupViews--> GroupStepper --(Inference, Opponents)--> actions --> WorkerPool.wake
                                      GroupStepper --steps--> RowAssembler --full rows--> LearnerLink (PUSH)
    LearnerLink (control, weights) + worker pipes --> one zmq.Poller --> ActorHost's loop

``run_host`` registers with the learner first (the config comes from it), then builds and runs the host;
everything that must be released (worker processes, shared memory, sockets) is released in reverse order.
A learner that comes back with a different config (restarted with another ``--config`` on the same port)
gets a new host: the old one's parts are released and every part is built again for the new config.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from contextlib import ExitStack
from types import TracebackType
from dataclasses import dataclass

import zmq

from actors.alternation import OpponentAlternation
from actors.assembler import RowAssembler
from actors.env_failures import EnvFailure
from actors.host import ActorHost
from actors.host_metrics import HostMetrics
from actors.inference import Inference
from actors.null_policy import NullInference
from actors.learner_link import LearnerLink, Registration
from actors.opponents import OpponentCache, Opponents
from actors.pool_client import PoolClient
from actors.recurrent_state import AgentStates
from actors.shared_rows_out import SharedRowsOut
from actors.shm import remove_stale_segments
from actors.slot_layout import SlotLayout
from actors.stepper import GroupStepper
from actors.stop_flag import StopFlag
from actors.team_inference import TeamInference
from actors.team_stepper import TeamStepper
from actors.worker import WorkerPriority
from actors.worker_pool import WorkerPool
from configs.loader import ConfigError, config_from_dict
from configs.plan import make_plan
from configs.schema import RunConfig
from envs.base import EnvSpec
from envs.registry import probe_env_spec
from envs.rows import message_sizing, run_row_layout
from policies.threads import use_threads
from protocol import Limits
from protocol.curve import ClientCurve
from protocol.endpoints import Endpoint
from telemetry.exporter import WILDCARD_HOSTS, MetricsEndpoint, is_loopback
from telemetry.registry import new_registry

LOG = logging.getLogger("sluice.actors")


@dataclass(frozen=True, kw_only=True)
class HostOptions:
    """What the command line asks of an actor host."""

    learner: Endpoint
    """The learner's control address."""
    num_workers: int | None = None
    """Env worker processes (None: the run's trainer.num_workers)."""
    null_policy: bool = False
    """Uniformly random legal actions instead of the learner's policy (pipeline benchmarks)."""
    pool: Endpoint | None = None
    """The opponent-pool server for self-play (None: the learner, which serves the pool itself)."""
    curve: ClientCurve | None = None
    """CURVE on every socket to the learner and the pool server (None: plaintext)."""
    metrics_host: str = "127.0.0.1"
    """Address the host's Prometheus endpoint binds (loopback unless asked: it is plain HTTP)."""
    metrics_port: int = 0
    """Its port (0: a free one); the learner learns it at registration and serves it to Prometheus."""
    device: str = "cpu"
    """Where the host's policy runs its batched forward passes: cpu or cuda (self-play opponents stay on the CPU)."""
    worker_priority: WorkerPriority = WorkerPriority()
    """How the env workers give the CPU to the host: added niceness (0-19), SCHED_BATCH."""


def run_host(options: HostOptions, stop: StopFlag) -> int:
    """Register with the learner, build the host, run it until ``stop`` is set; returns the exit code."""
    for name in remove_stale_segments():
        LOG.info("removed stale shared memory %s", name)
    with ExitStack() as resources:
        resources.push(_say_stopped(stop))
        metrics = HostMetrics(new_registry("actor_host"))
        endpoint = MetricsEndpoint(host=options.metrics_host, port=options.metrics_port, registry=metrics.registry,
                                   setting="--metrics-port PORT")
        resources.callback(endpoint.close)
        _announce_metrics(endpoint)
        link = LearnerLink(options.learner, num_workers=options.num_workers or 0, limits=Limits(), curve=options.curve,
                           metrics_address=endpoint.address)
        resources.push(_say_goodbye(link))
        registration = link.register(retry_s=1.0, should_stop=stop.is_set)
        if registration is not None:
            metrics.registered()
        elif link.shutdown_reason is not None:
            stop.request(f"learner: {link.shutdown_reason}")
        while registration is not None:  # another registration: the learner now runs a different config
            with ExitStack() as parts:
                with link.heartbeats_meanwhile(_heartbeat_interval_s(registration)):  # building takes seconds
                    host = build_host(registration, link, options=options, stop=stop, resources=parts,
                                      metrics=metrics)
                registration = host.run()
        return 0


def _heartbeat_interval_s(registration: Registration) -> float:
    """The learner's network.heartbeat_interval_s, as its registration's config says (the default without one)."""
    network = registration.config.get("network")
    interval = network.get("heartbeat_interval_s") if isinstance(network, dict) else None
    return float(interval) if isinstance(interval, (int, float)) and interval > 0 else 1.0


def _announce_metrics(endpoint: MetricsEndpoint) -> None:
    """Say where /metrics is, with a warning when it is reachable beyond this machine (plain HTTP)."""
    print(f"actors: Prometheus metrics at {endpoint.url}", flush=True)
    if endpoint.host in WILDCARD_HOSTS or not is_loopback(endpoint.host):
        print(f"actors: warning: /metrics binds {endpoint.address}, beyond loopback: plain HTTP without "
              "authentication, readable by anyone who reaches that address", flush=True)


def _say_stopped(stop: StopFlag) -> Callable[[type[BaseException] | None, BaseException | None,
                                               TracebackType | None], bool]:
    """The exit callback that says why the host stopped; nothing when an error stops it (the error line says why,
    and it is the host's last line)."""
    def say(_kind: type[BaseException] | None, error: BaseException | None, _trace: TracebackType | None) -> bool:
        if error is None:
            print(f"actors: stopped ({stop.reason or 'done'})", flush=True)
        return False
    return say


def _say_goodbye(link: LearnerLink) -> Callable[[type[BaseException] | None, BaseException | None,
                                                  TracebackType | None], bool]:
    """The exit callback that closes ``link`` last: its BYE names the error the host stops on (an env that
    cannot run, a worker in a crash loop, the pool server failing), so the learner logs and counts it."""
    def close(_kind: type[BaseException] | None, error: BaseException | None, _trace: TracebackType | None) -> bool:
        if isinstance(error, EnvFailure):
            link.close(reason=error.report.goodbye())
        else:
            link.close(reason=f"{type(error).__name__}: {error}" if isinstance(error, Exception) else None)
        return False
    return close


def build_host(registration: Registration, link: LearnerLink, *, options: HostOptions, stop: StopFlag,
               resources: ExitStack, metrics: HostMetrics) -> ActorHost:
    """Every part of an actor host and the links between them; what needs releasing goes on ``resources``."""
    config = config_from_dict(registration.config)
    use_threads(config.run.torch_threads)
    spec = probe_env_spec(config.env, note=lambda line: print(f"actors: {line}", flush=True))  # a child builds it
    plan = make_plan(config.trainer, num_agents=config.env.num_agents,
                     num_workers=options.num_workers or config.trainer.num_workers)
    layout = SlotLayout.from_plan(plan, groups=config.trainer.async_factor, agents_per_env=spec.num_agents)
    seed = config.run.seed + os.getpid()
    if config.trainer.algorithm == "coma":
        if options.null_policy:
            raise ConfigError("--null-policy measures PPO's per-agent pipeline; this learner trains trainer.algorithm "
                              "coma, whose hosts act with the team's actors")
        if options.device != "cpu":
            raise ConfigError(f"--device {options.device}: the team actors of trainer.algorithm coma run on the CPU "
                              f"only; leave --device out")
        team = TeamInference(spec, config.coma, seed=seed)
        team.load(registration.version, registration.weights)
        rows = run_row_layout(config, spec, state_size=0)
        sizing = message_sizing(config, rows)
        assembler = RowAssembler.for_layout(rows, num_agents=layout.total_envs,
                                            num_rows=2 * layout.total_envs + 2 * sizing.rows)
        assembler.warm_up()
        stepper: GroupStepper = TeamStepper(env_spec=spec, layout=layout, inference=team, assembler=assembler,
                                            metrics=metrics)
        alternation = None
    else:
        inference = (NullInference(spec, seed=seed) if options.null_policy
                     else Inference(spec, config.model, seed=seed, device=options.device))
        inference.load(registration.version, registration.weights)
        rows = run_row_layout(config, spec, state_size=inference.state_size)
        sizing = message_sizing(config, rows)
        assembler = RowAssembler.for_layout(rows, num_agents=layout.total_slots,
                                            num_rows=2 * layout.total_slots + 2 * sizing.rows)
        assembler.warm_up()  # numba compiles now, not at the host's first steps
        alternation = (_opponent_alternation(config, spec, layout, endpoint=options.pool or options.learner,
                                             sender=link.name, seed=seed, curve=options.curve, resources=resources)
                       if config.selfplay.enabled else None)
        stepper = GroupStepper(env_spec=spec, layout=layout, inference=inference, assembler=assembler,
                               states=AgentStates(layout.total_slots, inference.state_size),
                               opponents=None if alternation is None else alternation.opponents, metrics=metrics)
    link.open_streams(registration, hwm=sizing.hwm,
                      buffer_bytes=config.network.socket_buffer_bytes)
    poller = zmq.Poller()
    poller.register(link.control, zmq.POLLIN)
    poller.register(link.weights, zmq.POLLIN)
    workers = resources.enter_context(WorkerPool(env_config=config.env, env_spec=spec, layout=layout,
                                                 seed=config.run.seed * 7919 + os.getpid() * 31, poller=poller,
                                                 stop=stop, on_restart=stepper.forget_worker,
                                                 priority=options.worker_priority))
    message_bytes = assembler.packed_bytes(sizing.rows)
    shared_rows = SharedRowsOut.for_messages(config.network, hwm=sizing.hwm, message_bytes=message_bytes)
    if shared_rows is not None:
        resources.callback(shared_rows.close)
        if link.rows_through_memory:
            print("actors: rows stay in shared memory for the learner on this machine", flush=True)
    policy = ", null policy (uniform random actions)" if options.null_policy else f", policy on {options.device}"
    print(f"actors: {layout.workers} workers x {layout.envs_per_worker} envs ({layout.groups} groups) of "
          f"{config.env.name}{policy}, up to {sizing.rows} rows per message, learner {options.learner.url} "
          f"(as {link.name}{', rows to ' + ', '.join(link.data_routes) if link.data_routes else ''})", flush=True)
    return ActorHost(link=link, registration=registration, network=config.network, sizing=sizing, workers=workers,
                     stepper=stepper, alternation=alternation, poller=poller, stop=stop, metrics=metrics,
                     shared_rows=shared_rows)


def _opponent_alternation(config: RunConfig, spec: EnvSpec, layout: SlotLayout, *, endpoint: Endpoint,
                          sender: str, seed: int, curve: ClientCurve | None,
                          resources: ExitStack) -> OpponentAlternation:
    """Self-play: the pool client, the snapshot cache, the seats, and the first assignment (blocking)."""
    client = PoolClient(endpoint, limits=Limits(max_message_bytes=config.network.max_message_bytes),
                        timeout_s=3 * config.network.heartbeat_interval_s, sender=sender, curve=curve)
    resources.callback(client.close)
    cache = OpponentCache(spec, config.model, capacity=config.selfplay.cache_size, fetch=client.snapshot, seed=seed)
    opponents = Opponents(num_envs=layout.total_envs, num_agents=spec.num_agents, cache=cache)
    alternation = OpponentAlternation(client=client, opponents=opponents,
                                      steps_per_alternation=config.selfplay.alternation_steps * layout.total_envs)
    resources.callback(lambda: LOG.info("%s", alternation.summary()))
    return alternation
