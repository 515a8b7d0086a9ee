"""``python -m protocol.keys``: make CurveZMQ key pairs for a learner and its actor hosts.

    python -m protocol.keys server keys/            # keys/server.key, keys/server.key_secret
    python -m protocol.keys client keys/ hostB      # keys/hostB.key, keys/hostB.key_secret

A ``.key`` file holds the public key (share it), a ``.key_secret`` file the pair (keep it: written 0600, never
overwritten). The files are pyzmq's certificate format, so ``zmq.auth.load_certificate`` reads them. The
learner gets ``server.key_secret`` and a directory of allowed client ``.key`` files; an actor host gets
``server.key`` and its own ``.key_secret``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import sys
from pathlib import Path

import zmq

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class KeyFileError(ValueError):
    """A key pair cannot be written as asked; the message says why."""


def _certificate(public: bytes, secret: bytes | None) -> str:
    """pyzmq's certificate text for a public key, and the secret key when given."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    lines = [f"#   ****  Generated on {stamp} by python -m protocol.keys (Sluice)  ****",
             "#   ZeroMQ CURVE " + ("**Secret** Certificate: DO NOT PROVIDE THIS FILE TO OTHER USERS nor change "
                                    "its permissions." if secret else "Public Certificate"),
             "", "metadata", "curve", f'    public-key = "{public.decode("ascii")}"']
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode("ascii")}"')
    return "\n".join(lines) + "\n"


def _write_new(path: Path, text: str, mode: int) -> None:
    """Create ``path`` with ``mode`` from the start (never a moment with wider permissions); refuses to overwrite."""
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise KeyFileError(f"{path} exists; refusing to overwrite a key (remove it first to make a new one)") from None
    with os.fdopen(descriptor, "w") as handle:
        handle.write(text)
    os.chmod(path, mode)  # in case the umask narrowed or widened what os.open asked for


def make_key_pair(directory: Path, name: str) -> tuple[Path, Path]:
    """Write ``NAME.key`` (public, 0644) and ``NAME.key_secret`` (pair, 0600) into ``directory``."""
    if not NAME_RE.match(name):
        raise KeyFileError(f"key name {name!r} must be 1-64 letters, digits, '.', '_' or '-', starting with a "
                           f"letter or digit")
    if not zmq.has("curve"):
        raise KeyFileError("this libzmq was built without CURVE support")
    directory.mkdir(parents=True, exist_ok=True)
    public, secret = zmq.curve_keypair()
    public_path, secret_path = directory / f"{name}.key", directory / f"{name}.key_secret"
    for path in (public_path, secret_path):
        if path.exists():
            raise KeyFileError(f"{path} exists; refusing to overwrite a key (remove it first to make a new one)")
    _write_new(secret_path, _certificate(public, secret), 0o600)
    _write_new(public_path, _certificate(public, None), 0o644)
    return public_path, secret_path


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m protocol.keys",
                                     description="Make CurveZMQ key pairs for a learner (server) and actor hosts "
                                                 "(clients).")
    commands = parser.add_subparsers(dest="command", required=True)
    server = commands.add_parser("server", help="the learner's (and pool server's) pair: DIR/server.key(_secret)")
    server.add_argument("directory", type=Path)
    client = commands.add_parser("client", help="an actor host's pair: DIR/NAME.key(_secret)")
    client.add_argument("directory", type=Path)
    client.add_argument("name", help="the host's name, e.g. its hostname")
    args = parser.parse_args(argv)
    name = "server" if args.command == "server" else args.name
    try:
        public_path, secret_path = make_key_pair(args.directory, name)
    except (KeyFileError, OSError) as err:
        print(f"python -m protocol.keys: error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {public_path} (public: share it) and {secret_path} (secret, mode 0600: keep it on this side)")
    if args.command == "server":
        print("learner: --curve-secret-key {0} --curve-allowed-clients DIR; actor hosts: --curve-server-key "
              "{1}".format(secret_path, public_path))
    else:
        print(f"copy {public_path.name} into the learner's allowed clients directory; the host runs with "
              f"--curve-client-key {secret_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
