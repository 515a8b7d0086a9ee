"""The bind rule: traffic that leaves the machine is encrypted and authenticated, or the user said ``--insecure``.

A server (learner, pool server) bound beyond loopback needs its CURVE keys; a client (actor host) that talks to
a server beyond loopback needs the server's public key and its own pair. Without them the start fails with a
message that says what to pass, unless ``--insecure`` asks for plaintext, which prints a warning on every start.
Keys given on loopback turn CURVE on there too.
"""

from __future__ import annotations

import sys

from .curve import ClientCurve, ServerCurve, load_client_curve, load_server_curve
from .endpoints import Endpoint

__all__ = ["STRICT_SERVER_KEYS_HELP", "InsecureEndpointError", "client_curve_for", "server_curve_for"]

MAKE_KEYS = "make them with python -m protocol.keys (docs/OPERATIONS.md, Multi-host)"
STRICT_SERVER_KEYS_HELP = ("refuse to start when the secret key file can be read by group or others "
                           "(default: a warning; chmod 600 it)")
"""--strict-keys of a CLI that serves with a CURVE secret key (the learner, the pool server)."""


class InsecureEndpointError(ValueError):
    """Plaintext beyond loopback without ``--insecure``; the message says which keys to pass."""


def _warn_insecure(who: str, endpoint: Endpoint) -> None:
    print(f"WARNING: {who} at {endpoint.url} runs WITHOUT encryption or authentication (--insecure): anyone who "
          f"can reach it can read and inject traffic", file=sys.stderr, flush=True)


def server_curve_for(endpoint: Endpoint, *, secret_key: str, allowed_clients: str, insecure: bool, who: str,
                     key_options: str, strict_keys: bool = False) -> ServerCurve | None:
    """The CURVE settings a server bound at ``endpoint`` uses (None: plaintext, allowed on loopback or insecure).

    ``key_options`` names how the user passes the keys (e.g. ``--curve-secret-key FILE --curve-allowed-clients
    DIR``); errors are CurveKeyError or InsecureEndpointError, both ValueErrors for one line on the console.
    ``strict_keys``: a secret key file open to group or others is a CurveKeyError, not a warning.
    """
    if bool(secret_key) != bool(allowed_clients):
        raise InsecureEndpointError(f"{who}: CURVE needs both the server secret key and the allowed clients "
                                    f"directory ({key_options})")
    if secret_key:
        return load_server_curve(secret_key, allowed_clients, strict_keys=strict_keys)
    if endpoint.is_loopback:
        return None
    if insecure:
        _warn_insecure(who, endpoint)
        return None
    raise InsecureEndpointError(f"{who} would bind {endpoint.url}, beyond loopback, where anyone who reaches it could "
                                f"send it data: pass {key_options} ({MAKE_KEYS}), or --insecure to run unencrypted "
                                f"and unauthenticated")


def client_curve_for(endpoint: Endpoint, *, server_key: str, client_key: str, insecure: bool, who: str,
                     key_options: str, strict_keys: bool = False) -> ClientCurve | None:
    """The CURVE settings a client of ``endpoint`` uses (None: plaintext, allowed on loopback or insecure;
    ``strict_keys`` as for ``server_curve_for``)."""
    if bool(server_key) != bool(client_key):
        raise InsecureEndpointError(f"{who}: CURVE needs both the server's public key and this host's secret key "
                                    f"({key_options})")
    if server_key:
        return load_client_curve(server_key, client_key, strict_keys=strict_keys)
    if endpoint.is_loopback:
        return None
    if insecure:
        _warn_insecure(who, endpoint)
        return None
    raise InsecureEndpointError(f"{who} {endpoint.url} is beyond loopback: pass {key_options} ({MAKE_KEYS}), or "
                                f"--insecure if the learner runs with --insecure")
