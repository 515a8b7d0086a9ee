"""The opponent-pool server: answers actor hosts' GET_OPPONENTS and GET_SNAPSHOT requests from a SnapshotStore.

It runs inside the learner's control thread by default (``ControlServer(pool=PoolService(...))``), and
standalone on its own ROUTER socket for a pool served apart from the learner:

    python -m learner.pool.server --run-dir runs/X --bind tcp://127.0.0.1:5560

(then ``python -m actors --pool tcp://HOST:5560``). GET_OPPONENTS {num_envs} draws one snapshot per env
with ``sample_opponents`` (all envs share one draw when ``per_env_opponent_sampling`` is false) and answers
OPPONENTS compactly, O(distinct snapshots + num_envs) bytes: ``digests`` and ``indices`` name each distinct
snapshot drawn once (its sha256 and pool index), and the uint16 array ``env_opponent`` gives each env the
position of its opponent in ``digests`` (plus ``alternation`` and ``num_snapshots``). GET_SNAPSHOT {digest}
answers SNAPSHOT with the snapshot's verified safetensors bytes as the uint8 array ``file``, so the host can check them against the
digest before parsing them. Nothing is unpickled anywhere.

Requests are answered on the thread that also answers the learner's heartbeats, so each does bounded work: a
weights file larger than the store's ``max_snapshot_bytes`` is refused unread (ERROR not_found), and a garbled
index.json is rebuilt rather than raised (learner/pool/store.py, "Trust", states the bound per request).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import zmq

from configs.schema import SelfPlaySection
from configs.baselines import BASELINE_DIGEST_PREFIX
from learner.pool.store import SnapshotStore, SnapshotStoreError, sample_baselines, sample_opponents
from learner.pool.metrics import PoolMetrics
from protocol import Limits, Message, MessageType, ProtocolError, decode, encode
from protocol.bind_rule import STRICT_SERVER_KEYS_HELP, InsecureEndpointError, server_curve_for
from protocol.curve import CurveKeyError, ServerCurve, ZapGuard
from protocol.endpoints import parse_endpoint
from telemetry.exporter import MetricsBindError, MetricsEndpoint
from telemetry.options import add_metrics_options, metrics_port_error
from telemetry.registry import new_registry

LOG = logging.getLogger("sluice.learner")

POOL_REQUESTS = (MessageType.GET_OPPONENTS, MessageType.GET_SNAPSHOT)
MAX_ENVS_PER_REQUEST = 8192
"""Envs one GET_OPPONENTS may ask for: one host's envs. A host's plan needs batch_size / bptt_horizon >= its envs x
agents, so 8192 two-player envs already take batches of 16384+ rows (configs/selfplay_connect4.yaml runs 256 envs
per host). The largest reply (8192 distinct snapshots, ~71 header bytes each, plus 2 bytes per env) is ~0.6 MB,
under the protocol's 1 MiB header limit (``Limits.max_header_bytes``), so ``PoolClient`` decodes any reply."""
ENV_OPPONENT_DTYPE = np.uint16
"""Dtype of the reply's per-env positions in ``digests`` (at most MAX_ENVS_PER_REQUEST distinct snapshots)."""


class PoolService:
    """Thread-safe: the learner adds snapshots while the control thread answers requests."""

    def __init__(self, store: SnapshotStore, section: SelfPlaySection, *, seed: int,
                 reload_index: bool = False, metrics: PoolMetrics | None = None) -> None:
        self.store = store
        self.metrics = metrics
        """Where requests are counted and timed (None: nowhere)."""
        if metrics is not None:
            metrics.watch_size(lambda: len(self.store))
        self.section = section
        self.reload_index = reload_index
        self.rng = np.random.default_rng(seed)
        self.lock = threading.Lock()
        self.alternations = 0
        self._unique: list[int] = []

    def add_snapshot(self, arrays: dict[str, np.ndarray], *, update: int, policy_version: int) -> None:
        """The learner's current weights become the newest snapshot."""
        with self.lock:
            self.store.add(arrays, update=update, policy_version=policy_version)

    def take_stats(self) -> dict[str, float | int | None]:
        """Pool size, and the mean number of unique opponents per alternation since the last call."""
        with self.lock:
            unique, self._unique = self._unique, []
            return {"pool_snapshots": len(self.store), "alternations": self.alternations,
                    "opponents_unique_mean": float(np.mean(unique)) if unique else None}

    def handle(self, message: Message) -> Message:
        """The reply to one pool request (ProtocolError for a bad one: the caller answers ERROR), counted and timed
        in ``metrics``."""
        started = time.perf_counter()
        try:
            reply = self._answer(message)
        except ProtocolError as err:
            if self.metrics is not None:
                self.metrics.refused(err.reason)
            raise
        if self.metrics is not None:
            sent = reply.arrays["file"].nbytes if reply.type is MessageType.SNAPSHOT else 0
            self.metrics.answered(message.type.value, seconds=time.perf_counter() - started, sent_bytes=sent)
        return reply

    def _answer(self, message: Message) -> Message:
        if message.type is MessageType.GET_OPPONENTS:
            return self._opponents(message.fields["num_envs"])
        if message.type is MessageType.GET_SNAPSHOT:
            return self._snapshot(message.fields["digest"])
        raise ProtocolError("unexpected_type", f"the pool server does not accept {message.type.value}")

    def _opponents(self, num_envs: int) -> Message:
        if not 1 <= num_envs <= MAX_ENVS_PER_REQUEST:
            raise ProtocolError("bad_field", f"num_envs must be in [1, {MAX_ENVS_PER_REQUEST}], got {num_envs}")
        section = self.section
        with self.lock:
            if self.reload_index:  # never raises for what index.json holds (learner/pool/store.py, "Trust")
                self.store.reload()
            count = len(self.store)
            if count == 0:
                raise ProtocolError("not_ready", "the opponent pool has no snapshot yet")
            draws = num_envs if section.per_env_opponent_sampling else 1
            indices = sample_opponents(count, draws, pool_size=section.opponent_pool_size,
                                       beta=section.opponent_pool_beta,
                                       exploration=section.opponent_pool_exploration, rng=self.rng)
            keys = indices  # >= 0: a pool snapshot; -1 - j: the j-th of selfplay.baseline_opponents
            names = list(section.baseline_opponents)
            if names:  # no extra rng draw without baselines: pure self-play draws as before
                picks = sample_baselines(draws, list(section.baseline_opponents.values()), rng=self.rng)
                keys = np.where(picks == len(names), indices, -1 - picks)
            drawn, env_opponent = np.unique(np.resize(keys, num_envs), return_inverse=True)
            digests = [self.store.snapshot(int(k)).hash if k >= 0 else BASELINE_DIGEST_PREFIX + names[-1 - k]
                       for k in drawn]
            self.alternations += 1
            self._unique.append(len(set(digests)))
            alternation = self.alternations
        return Message(type=MessageType.OPPONENTS, sender="pool",
                       fields={"alternation": alternation, "digests": digests,
                               "indices": [max(int(k), -1) for k in drawn], "num_snapshots": count},
                       arrays={"env_opponent": env_opponent.astype(ENV_OPPONENT_DTYPE)})

    def _snapshot(self, digest: str) -> Message:
        try:
            with self.lock:
                data = self.store.read_bytes(digest)
        except ValueError as err:
            raise ProtocolError("bad_field", str(err)) from err
        except SnapshotStoreError as err:
            raise ProtocolError("not_found", str(err)) from err
        return Message(type=MessageType.SNAPSHOT, sender="pool", fields={"digest": digest},
                       arrays={"file": np.frombuffer(data, dtype=np.uint8)})


def open_run_pool(pool_dir: Path, section: SelfPlaySection, *, seed: int, metrics: PoolMetrics,
                  weights: dict[str, np.ndarray], update: int, policy_version: int) -> PoolService:
    """A learner's opponent pool (kept across --resume): snapshots newer than ``update`` are dropped (a resumed run
    takes them again), and an empty pool starts with the current ``weights``."""
    service = PoolService(SnapshotStore(pool_dir), section, seed=seed, metrics=metrics)
    dropped = service.store.truncate_after(update)
    if dropped:
        LOG.info("opponent pool: dropped %d snapshots newer than update %d", dropped, update)
    if len(service.store) == 0:
        service.add_snapshot(weights, update=update, policy_version=policy_version)
    LOG.info("opponent pool: %d snapshots in %s", len(service.store), pool_dir)
    return service


def serve(service: PoolService, endpoint: str, stop: threading.Event, limits: Limits | None = None,
          curve: ServerCurve | None = None) -> None:
    """Standalone: answer pool requests on a ROUTER bound at ``endpoint`` until ``stop`` is set (CURVE with
    ``curve``: only allow-listed clients get an answer)."""
    limits = limits or Limits()
    context = zmq.Context()
    zap = None if curve is None else ZapGuard(context, curve)
    socket = context.socket(zmq.ROUTER)
    try:
        if curve is not None:
            curve.apply(socket)
        if zap is not None:
            zap.watch(socket, "pool")
            zap.start_watching()
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.MAXMSGSIZE, limits.max_message_bytes)
        socket.bind(endpoint)
        while not stop.is_set():
            if not socket.poll(100):
                continue
            identity, *payload = socket.recv_multipart(copy=False)
            socket.send_multipart([identity, *encode(_reply(service, payload, limits))], copy=False)
    finally:
        socket.close(linger=0)
        if zap is not None:
            zap.stop()
        context.term()


def _reply(service: PoolService, payload: list, limits: Limits) -> Message:
    """The answer to one message on the standalone socket: the pool's reply, or ERROR naming what was wrong (a
    message that is not a pool request is counted as refused here; the service counts its own refusals)."""
    try:
        message = decode(payload, limits)
        if message.type not in POOL_REQUESTS:
            raise ProtocolError("unexpected_type", f"the pool server does not accept {message.type.value}")
    except ProtocolError as err:
        if service.metrics is not None:
            service.metrics.refused(err.reason)
        return _error(err)
    try:
        return service.handle(message)
    except ProtocolError as err:
        return _error(err)


def _error(err: ProtocolError) -> Message:
    return Message(type=MessageType.ERROR, sender="pool", fields={"reason": err.reason, "message": str(err)})


def main(argv: list[str] | None = None) -> int:
    """``python -m learner.pool.server``: serve a run's pool on its own socket."""
    parser = argparse.ArgumentParser(prog="python -m learner.pool.server",
                                     description="Serve a run's opponent pool to actor hosts (seeds/002).")
    parser.add_argument("--run-dir", required=True, help="the run whose pool/ to serve")
    parser.add_argument("--bind", default="tcp://127.0.0.1:5560", help="ROUTER address (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the opponent draws")
    parser.add_argument("--curve-secret-key", default="", metavar="FILE",
                        help="CURVE: the server.key_secret (the learner's pair serves here too)")
    parser.add_argument("--curve-allowed-clients", default="", metavar="DIR",
                        help="CURVE: directory of allowed actor hosts' public .key files")
    parser.add_argument("--insecure", action="store_true",
                        help="allow binding beyond loopback without CURVE (no encryption, no authentication)")
    parser.add_argument("--strict-keys", action="store_true", help=STRICT_SERVER_KEYS_HELP)
    add_metrics_options(parser, port_default=None, port_help="port of the Prometheus /metrics (default: the --bind "
                                                             "port + 1; 0: a free port)")
    args = parser.parse_args(argv)
    try:
        bind = parse_endpoint(args.bind, "--bind")
        metrics_port = args.metrics_port if args.metrics_port is not None else (bind.port or 0) + 1
        if (problem := metrics_port_error(metrics_port)) is not None:
            raise ValueError(problem)
        curve = server_curve_for(bind, secret_key=args.curve_secret_key,
                                 allowed_clients=args.curve_allowed_clients, insecure=args.insecure,
                                 who="the pool server",
                                 key_options="--curve-secret-key FILE --curve-allowed-clients DIR",
                                 strict_keys=args.strict_keys)
    except (ValueError, CurveKeyError, InsecureEndpointError) as err:
        print(f"python -m learner.pool.server: error: {err}", file=sys.stderr)
        return 2
    from learner.run.run_dir import RunDirError, read_run_config
    run_dir = Path(args.run_dir)
    try:
        config = read_run_config(run_dir)
    except RunDirError as err:
        print(f"python -m learner.pool.server: error: {run_dir} is not a run directory: {err}", file=sys.stderr)
        return 2
    if not (run_dir / "pool").is_dir():
        print(f"python -m learner.pool.server: error: {run_dir} has no pool/ (was selfplay.enabled true?)",
              file=sys.stderr)
        return 2
    metrics = PoolMetrics(new_registry("pool_server"))
    service = PoolService(SnapshotStore(run_dir / "pool"), config.selfplay, seed=args.seed, reload_index=True,
                          metrics=metrics)
    try:
        endpoint = MetricsEndpoint(host=args.metrics_host, port=metrics_port, registry=metrics.registry,
                                   setting="--metrics-port PORT")
    except MetricsBindError as err:
        print(f"python -m learner.pool.server: error: {err}", file=sys.stderr)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"pool server: {len(service.store)} snapshots of {run_dir}, serving on {args.bind}; Prometheus metrics at "
          f"{endpoint.url}", flush=True)
    try:
        serve(service, args.bind, stop, curve=curve)
    finally:
        endpoint.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
