"""The learner's three socket addresses, from network.host and network.port, and errors in them by type.

Control (ROUTER) binds at network.port, data (PULL) at port + 1 and weights (PUB) at port + 2. A host that
is not an address, or an address that cannot be bound (in use, not this machine's), is an ``AddressError``:
the user's to fix, so the CLI prints it as one line.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import zmq

from configs.schema import NetworkSection
from protocol.bind_rule import server_curve_for
from protocol.curve import ServerCurve
from protocol.endpoints import Endpoint, parse_endpoint


class AddressError(ValueError):
    """network.host / network.port do not give addresses this learner can bind; the message says which."""


@dataclass(frozen=True, kw_only=True)
class LearnerAddresses:
    """Where the learner's sockets bind."""

    control: Endpoint
    """Registration, heartbeats, weights on request and pool requests (ROUTER), at network.port."""
    data: Endpoint
    """Row blocks from actor hosts (PULL), at network.port + 1."""
    weights: Endpoint
    """Weights published after every update (PUB), at network.port + 2."""


def learner_addresses(network: NetworkSection) -> LearnerAddresses:
    """The three addresses of ``network``; AddressError if its host is not a host name or address."""
    try:
        control = parse_endpoint(f"tcp://{network.host}:{network.port}", "learner address (network.host, network.port)")
        return LearnerAddresses(control=control, data=control.with_port(network.port + 1),
                                weights=control.with_port(network.port + 2))
    except ValueError as err:
        raise AddressError(str(err)) from err


LEARNER_KEY_OPTIONS = ("--curve-secret-key FILE --curve-allowed-clients DIR (network.curve_secret_key, "
                       "network.curve_allowed_clients)")


def metrics_port(network: NetworkSection) -> int:
    """The learner's Prometheus port: network.metrics_port, or network.port + 3 when it is not set."""
    return network.port + 3 if network.metrics_port is None else network.metrics_port


def learner_curve(network: NetworkSection, *, insecure: bool, strict_keys: bool = False) -> ServerCurve | None:
    """The learner's CURVE settings under the bind rule (protocol/bind_rule.py): None means plaintext, which is
    allowed on loopback and with ``insecure``; beyond loopback without keys it is an InsecureEndpointError.
    ``strict_keys``: a server secret key file open to group or others is a CurveKeyError, not a warning."""
    return server_curve_for(learner_addresses(network).control, secret_key=network.curve_secret_key,
                            allowed_clients=network.curve_allowed_clients, insecure=insecure, who="the learner",
                            key_options=LEARNER_KEY_OPTIONS, strict_keys=strict_keys)


@contextmanager
def binding(address: Endpoint) -> Iterator[None]:
    """A failure to bind ``address`` inside the block becomes an AddressError naming it."""
    try:
        yield
    except zmq.ZMQError as err:
        raise AddressError(f"cannot bind {address.url}: {err.strerror} (another learner on these ports? "
                           f"the learner binds network.port and the next two; choose free ones with "
                           f"--set network.port=PORT)") from err
