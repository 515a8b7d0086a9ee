"""The learner's three sockets, bound together: the control server (ROUTER: registration, heartbeats, the opponent
pool), the ingest (PULL: rows into the batch slots) and the weights publisher (PUB), sharing one registry of the
actor hosts that may send rows."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import zmq

from configs.loader import config_to_dict
from configs.schema import RunConfig
from envs.base import EnvSpec
from learner.pool.server import PoolService
from learner.serve.addresses import LearnerAddresses, binding
from learner.serve.control import ControlServer
from learner.serve.host_routing import HostRouting
from learner.serve.host_sizing import HostSizing
from learner.serve.ingest import Ingest, IngestObserver, open_ingest
from learner.serve.senders import SenderRegistry
from learner.serve.weights import WeightsPublisher
from protocol import Limits
from protocol.curve import ServerCurve, ZapGuard


@dataclass(frozen=True, kw_only=True)
class Serving:
    """The bound sockets' owners; the caller starts the two threads and closes them."""

    control: ControlServer
    """Registration, heartbeats, weights on request, the opponent pool (a thread)."""
    ingest: Ingest
    """Rows into the batch slots, counted (a thread)."""
    publisher: WeightsPublisher
    """New weights to every subscribed host after each update."""

    def publish_weights(self, version: int, weights: dict[str, np.ndarray]) -> None:
        """Send new weights to the subscribed hosts and hand them to the control server (for hosts that register
        or ask)."""
        self.publisher.publish(version, weights)
        self.control.set_weights(version, weights)

    def shut_down_hosts(self, reason: str, *, grace_s: float) -> None:
        """Tell actor hosts to exit, and give them up to ``grace_s`` to hear it and say goodbye."""
        self.control.begin_shutdown(reason)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and self.control.host_count() > 0:
            self.publisher.publish_shutdown(reason)
            time.sleep(0.1)


def bind_serving(config: RunConfig, spec: EnvSpec, addresses: LearnerAddresses, *, context: zmq.Context,
                 stop: threading.Event, segments: int, state_size: int, pool: PoolService | None,
                 curve: ServerCurve | None, zap: ZapGuard | None, announce: Callable[[str], None],
                 observer: IngestObserver | None, routing: HostRouting | None, pinned: bool,
                 rank_ipc: dict[str, dict[str, str]] | None = None) -> Serving:
    """Bind the control, data and weights sockets (AddressError naming the one that cannot be); ``segments`` and
    ``state_size``: the batch rows and the policy's recurrent state; ``routing``: the ranks' data endpoints hosts are
    sent to (None: this learner's own); ``pinned``: page-locked batch buffers for a learner on a GPU; ``rank_ipc``:
    the other ranks' ipc routes by announced data endpoint (learner/ranks/context.gather_ipc_routes), announced with
    this rank's own in REGISTERED's ``data_ipc`` (protocol/same_machine.py)."""
    net = config.network
    registration = {"config": config_to_dict(config), "data_endpoint": addresses.data.url,
                    "weights_endpoint": addresses.weights.url, "run_id": uuid.uuid4().hex,
                    "packed_rows": True}  # the ingest reads ROWS with every array in one frame
    registry = SenderRegistry()  # the control server adds and removes senders; the ingest checks rows against it
    with binding(addresses.control):
        control = ControlServer(context=context, endpoint=addresses.control.url, registration=registration,
                                peer_timeout_s=net.peer_timeout_s,
                                limits=Limits(max_message_bytes=net.max_message_bytes), stop=stop, registry=registry,
                                sizing=HostSizing(trainer=config.trainer, num_agents=config.env.num_agents),
                                pool=pool, curve=curve, announce=announce, routing=routing, zap=zap)
    with binding(addresses.data):
        ingest = open_ingest(config, spec, context=context, endpoint=addresses.data.url, segments=segments,
                             state_size=state_size, stop=stop, registry=registry, curve=curve, observer=observer,
                             pinned=pinned, rank=0)
    if ingest.ipc is not None or rank_ipc:  # the control thread has not started: it reads the whole registration
        own = {} if ingest.ipc is None else {url: ingest.ipc.to_field() for url in
                                             (addresses.data.url, *(routing.endpoints[:1] if routing else ()))}
        registration["data_ipc"] = {**(rank_ipc or {}), **own}
    if ingest.shared is not None:
        registration["shared_rows"] = True  # hosts reaching it over ipc leave their rows in shared memory
    with binding(addresses.weights):
        publisher = WeightsPublisher(context=context, endpoint=addresses.weights.url, curve=curve)
    return Serving(control=control, ingest=ingest, publisher=publisher)
