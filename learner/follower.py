"""A learner rank other than 0 under torchrun (issue 15): its own data socket and share of the batch, the same
updates as every rank, nothing else.

It binds a data (PULL) socket at network.port + 3 + rank (learner/ranks/context.py), accepts rows from the actor hosts rank 0
routes to it (checked against the hosts rank 0 registered, which ``RankLink`` copies), fills batches of segments / K
rows, and runs each update rank 0 decides (learner/ranks/lockstep.py), its gradients averaged with the other ranks'.
Control, weights, checkpoints, metrics, the opponent pool and the console belong to rank 0. A signal asks rank 0 to
stop the run; the follower leaves when rank 0 decides so (or when rank 0 is gone).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import zmq

from configs.schema import RunConfig
from learner.build import build_learner
from learner.serve.addresses import AddressError, binding, learner_addresses
from learner.update.batch import to_batch
from learner.run.checkpoint import Checkpoint, load_checkpoint
from learner.run.checkpoint_integrity import CheckpointDamaged
from learner.ranks.distributed import CollectiveTimeout
from learner.serve.ingest import Ingest, open_ingest
from learner.ranks.link import RankLink
from learner.ranks.lockstep import FollowerLockstep
from learner.ranks.store import STOP_PREFIX
from learner.run.run_dir import RunDirError
from learner.ranks.context import FACTS_TIMEOUT, RankContext, announce_endpoint, announce_ipc, rank_data_binding
from learner.serve.senders import SenderRegistry
from protocol.curve import ServerCurve, ZapGuard

LOG = logging.getLogger("sluice.learner.follower")


@dataclass(kw_only=True)
class FollowerState:
    """What a follower keeps between updates."""

    update: int = 0
    """Updates done (a resumed run's included): the next update's index, as rank 0 counts them."""
    signal_reason: str | None = None
    """Set by SIGINT/SIGTERM: passed on to rank 0 as a stop request."""
    exit_code: int = 0
    """What ``run`` returns: 0, 128 + a signal's number, or 1 after a rank failure."""
    stopped_by: list[str] = field(default_factory=list)
    """Why the loop ended (rank 0's reason, or the failure)."""


def rank_zeros_checkpoint(ranks: RankContext) -> Checkpoint | None:
    """The checkpoint rank 0 resumed from, as rank 0 announced it (None for a fresh run)."""
    path = ranks.board.wait_text("resume_from", 0, FACTS_TIMEOUT)
    return load_checkpoint_for(path, rank=ranks.rank) if path else None


class FollowerRank:
    """One follower rank's process."""

    def __init__(self, config: RunConfig, ranks: RankContext, *, curve: ServerCurve | None) -> None:
        self.config = config
        self.ranks = ranks
        self.curve = curve
        self.state = FollowerState()
        setup = build_learner(config, ranks, resume=lambda: rank_zeros_checkpoint(ranks), seed_offset=7919 * ranks.rank)
        self.device, self.spec, self.plan, self.algorithm = setup.device, setup.spec, setup.plan, setup.algorithm
        if setup.checkpoint is not None:
            self.state.update = setup.checkpoint.trainer_state.update
        self.policy_version = 0 if setup.checkpoint is None else setup.checkpoint.trainer_state.policy_version

    def run(self) -> int:
        """Serve rows and update until rank 0 stops the run; returns the exit code."""
        context = zmq.Context()
        threads_stop = threading.Event()
        zap = None if self.curve is None else ZapGuard(context, self.curve)
        registry = SenderRegistry()
        try:
            ingest = self._bind(context, threads_stop, registry)
        except AddressError as err:
            self.ranks.board.set_text("endpoint", self.ranks.rank, f"error: {err}")
            if zap is not None:
                zap.stop()
            context.destroy(linger=0)
            raise
        if zap is not None:
            zap.watch(ingest.socket, "data")
            zap.start_watching()
        link = RankLink(self.ranks, registry, fill=lambda: ingest.occupancy()["filling"], stop=threads_stop)
        ingest.start()
        link.start()
        lockstep = FollowerLockstep(self.ranks, link)
        print(f"learner rank {self.ranks.rank} of {self.ranks.world_size}: data socket bound, "
              f"{self.plan.segments} rows per batch", flush=True)
        try:
            self._loop(ingest, lockstep)
        finally:
            threads_stop.set()
            ingest.join(timeout=5)
            link.join(timeout=5)
            if zap is not None:
                zap.stop()
            context.term()
        print(f"learner rank {self.ranks.rank}: stopped ({'; '.join(self.state.stopped_by) or 'done'})", flush=True)
        return self.state.exit_code

    def _bind(self, context: zmq.Context, threads_stop: threading.Event, registry: SenderRegistry) -> Ingest:
        """This rank's data socket and ingest, its endpoint announced to rank 0 (AddressError when it cannot bind)."""
        control = learner_addresses(self.config.network).control
        try:
            address = rank_data_binding(control, self.ranks)
        except ValueError as err:
            raise AddressError(str(err)) from err
        with binding(address):
            ingest = open_ingest(self.config, self.spec, context=context, endpoint=address.url,
                                 segments=self.plan.segments, state_size=self.algorithm.policy.state_size,
                                 stop=threads_stop, registry=registry, curve=self.curve,
                                 pinned=self.device.type == "cuda", rank=self.ranks.rank)
        ingest.set_policy_version(self.policy_version)
        announce_ipc(ingest.ipc, self.ranks)  # before the endpoint: rank 0 reads it once it has the endpoint
        announce_endpoint(address, self.ranks)
        return ingest

    def _loop(self, ingest: Ingest, lockstep: FollowerLockstep) -> None:
        rows_wait_from = time.monotonic()
        while True:
            update = self.state.update
            index = self._wait_for_batch(ingest, lockstep, update)
            if index is None:
                return
            lockstep.ready(update, ingest.counters.take_delta(rows_wait_s=time.monotonic() - rows_wait_from))
            decision = lockstep.wait_decision(update, local_stop=lambda: self.state.signal_reason)
            if decision.startswith(STOP_PREFIX):
                self.state.stopped_by.append(decision.removeprefix(STOP_PREFIX))
                return
            try:
                self.algorithm.update(to_batch(ingest.slots.buffers[index], self.device), update_index=update)
            except CollectiveTimeout as err:
                self.state.stopped_by.append(str(err))
                self.state.exit_code = 1
                return
            ingest.slots.release(index)
            rows_wait_from = time.monotonic()
            self.state.update += 1
            ingest.set_policy_version(ingest.policy_version + 1)

    def _wait_for_batch(self, ingest: Ingest, lockstep: FollowerLockstep, update: int) -> int | None:
        """This rank's next full batch; None when rank 0 decided to stop before ``update`` (a signal here is passed
        on to rank 0 meanwhile)."""
        while True:
            if ingest.error is not None:
                lockstep.ask_stop(f"ingest failed: {ingest.error!r}")
            if self.state.signal_reason is not None:
                lockstep.ask_stop(self.state.signal_reason)
            reason = lockstep.stop_decided(update)
            if reason is not None:
                self.state.stopped_by.append(reason)
                return None
            gone = lockstep.link.gone()
            if gone:
                self.state.stopped_by.extend(gone)
                self.state.exit_code = 1
                return None
            index = ingest.slots.next_full(timeout=0.05)
            if index is not None:
                return index

    def install_signal_handlers(self) -> None:
        """SIGINT/SIGTERM: ask rank 0 to stop the run; this rank then exits with 128 + the signal's number."""
        def handler(signum: int, _frame: object) -> None:
            self.state.signal_reason = f"{signal.Signals(signum).name} received by learner rank {self.ranks.rank}"
            self.state.exit_code = 128 + signum
        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)


def load_checkpoint_for(path: str, *, rank: int) -> Checkpoint:
    """The checkpoint rank 0 resumed from, read by this rank (RunDirError when it cannot read it: the run directory
    must be on storage every learner machine shares, and read the same there)."""
    try:
        return load_checkpoint(Path(path))
    except CheckpointDamaged as err:
        raise RunDirError(f"learner rank {rank} finds the checkpoint rank 0 resumed from ({path}) damaged: "
                          f"{err}") from err
    except FileNotFoundError as err:
        raise RunDirError(f"learner rank {rank} cannot read the checkpoint rank 0 resumed from ({path}): with learner "
                          "ranks on several machines the run directory must be on storage they all share") from err

