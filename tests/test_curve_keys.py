"""Key hygiene under CURVE (issue 28): a key removed from the allow-list is revoked, a secret key file open to group
or others is warned about (or refused with --strict-keys), and a host with the wrong server key stops with a reason.

Real ZeroMQ sockets in the process, real ``python -m actors`` / ``python -m learner`` processes for the CLIs, and one
real learner shared by the tests at the end of the file.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
import zmq

from actors.learner_link import LearnerLink, LearnerRefused
from protocol import Limits, MessageType
from protocol.curve import AllowList, CurveKeyError, ZapGuard, load_client_curve, load_server_curve
from protocol.endpoints import parse_endpoint
from protocol.keys import main as keys_main
from tests.processes import REPO, Run, kill_tree, start, wait_for

HOSTS = ("good", "spare", "revoked", "lax")


def _make_keys(root):
    assert keys_main(["server", str(root)]) == 0
    assert keys_main(["server", str(root / "other")]) == 0  # a second learner's pair: the wrong server key
    for name in HOSTS:
        assert keys_main(["client", str(root), name]) == 0
    (root / "allowed").mkdir()
    for name in HOSTS:
        shutil.copy(root / f"{name}.key", root / "allowed" / f"{name}.key")
    return root


@pytest.fixture
def keys(tmp_path):
    return _make_keys(tmp_path / "keys")


def public(path) -> str:
    return zmq.auth.load_certificate(path)[0].decode("ascii")


def _client(context, keys, name, port):
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    load_client_curve(keys / "server.key", keys / f"{name}.key_secret").apply(sock)
    sock.connect(f"tcp://127.0.0.1:{port}")
    return sock


def _revocations(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "removed from" in r.getMessage()]


def test_a_removed_key_is_refused_at_once_and_handed_to_take_revoked(keys, caplog):
    caplog.set_level(logging.WARNING, logger="sluice.protocol.curve")
    server_context, client_context = zmq.Context(), zmq.Context()
    curve = load_server_curve(keys / "server.key_secret", keys / "allowed")
    guard = ZapGuard(server_context, curve)
    server = server_context.socket(zmq.ROUTER)
    good_key = public(keys / "good.key")
    try:
        curve.apply(server)
        port = server.bind_to_random_port("tcp://127.0.0.1")
        connected = _client(client_context, keys, "good", port)
        connected.send(b"before")
        assert server.poll(5000)
        assert server.recv_multipart(copy=False)[-1].get("User-Id") == good_key
        assert guard.is_allowed(good_key) and guard.take_revoked() == set()

        (keys / "allowed" / "good.key").unlink()
        again = _client(client_context, keys, "good", port)  # at once: no wait for the watcher
        again.send(b"after")
        assert wait_for(lambda: guard.refused_keys() == 1, 2)
        assert not server.poll(300)
        # the watcher logs the removal and queues it without anyone asking
        assert wait_for(lambda: len(_revocations(caplog)) == 1, 2)
        assert _revocations(caplog) == [f"curve: client key {good_key} removed from {keys / 'allowed'}: refused from "
                                        f"now on"]
        assert not guard.is_allowed(good_key) and guard.is_allowed(public(keys / "spare.key").encode())
        assert guard.take_revoked() == {good_key}
        assert guard.take_revoked() == set()  # each key once

        # a key removed and put back before anyone asked is not handed out; it is allowed again
        (keys / "allowed" / "spare.key").rename(keys / "spare.key.off")
        assert wait_for(lambda: len(_revocations(caplog)) == 2, 2)
        (keys / "spare.key.off").rename(keys / "allowed" / "spare.key")
        assert wait_for(lambda: guard.is_allowed(public(keys / "spare.key")), 2)
        assert guard.take_revoked() == set()
        shutil.copy(keys / "good.key", keys / "allowed" / "good.key")
        back = _client(client_context, keys, "good", port)
        back.send(b"back")
        assert server.poll(5000) and server.recv_multipart()[-1] == b"back"
        for sock in (connected, again, back):
            sock.close(linger=0)
    finally:
        server.close(linger=0)
        guard.stop()
        server_context.term()
        client_context.term()


def test_an_unreadable_key_file_keeps_its_key_and_a_vanished_directory_allows_no_one(keys, caplog):
    caplog.set_level(logging.WARNING, logger="sluice.protocol.curve")
    allowed = keys / "allowed"
    allow_list = AllowList(allowed, poll_s=0.0)
    good, spare = public(keys / "good.key"), public(keys / "spare.key")
    assert allow_list.is_allowed(good)
    (allowed / "good.key").write_text("half written\n")  # a copy caught midway revokes no one
    assert allow_list.is_allowed(good) and allow_list.take_revoked() == set()
    assert any(f"allowed client key {str(allowed / 'good.key')!r} is not a CURVE key file" in r.getMessage()
               and f"its key {good} stays allowed until the file is fixed or removed" in r.getMessage()
               for r in caplog.records)
    (allowed / "new.key").write_text("junk\n")
    allow_list.refresh()
    assert any("new.key' is not a CURVE key file" in r.getMessage() and "ignored until it is fixed" in r.getMessage()
               for r in caplog.records)
    shutil.copy(keys / "spare.key", allowed / "good.key")  # a file that now holds another key: the old one goes
    assert not allow_list.is_allowed(good) and allow_list.take_revoked() == {good}
    shutil.rmtree(allowed)
    assert not allow_list.is_allowed(spare) and allow_list.take_revoked() == {spare, *(public(keys / f"{name}.key")
                                                                                       for name in ("revoked", "lax"))}
    assert any(f"curve: allowed clients directory {allowed} cannot be listed: every client is refused until it can"
               == r.getMessage() for r in caplog.records)
    allowed.mkdir()
    shutil.copy(keys / "spare.key", allowed / "spare.key")
    assert allow_list.is_allowed(spare)


def test_is_allowed_and_take_revoked_are_safe_from_many_threads(keys):
    allow_list = AllowList(keys / "allowed", poll_s=0.0)
    names = ("good", "spare", "revoked")
    taken: list[str] = []
    stop = threading.Event()

    def ask() -> None:
        while not stop.is_set():
            for name in names:
                allow_list.is_allowed(public(keys / f"{name}.key"))
            taken.extend(allow_list.take_revoked())

    threads = [threading.Thread(target=ask) for _ in range(4)]
    for thread in threads:
        thread.start()
    for name in names:
        (keys / "allowed" / f"{name}.key").unlink()
        time.sleep(0.05)
    time.sleep(0.1)
    stop.set()
    for thread in threads:
        thread.join(timeout=10)
    taken.extend(allow_list.take_revoked())
    assert sorted(taken) == sorted(public(keys / f"{name}.key") for name in names)


def test_a_secret_key_open_to_others_is_warned_about_or_refused(keys, capsys):
    secret = keys / "server.key_secret"
    os.chmod(secret, 0o644)
    load_server_curve(secret, keys / "allowed")
    assert capsys.readouterr().err == (f"WARNING: server secret key file {str(secret)!r} has mode 0644, open to group "
                                       f"or others: run chmod 600 {secret} (--strict-keys refuses such a file)\n")
    with pytest.raises(CurveKeyError) as refused:
        load_server_curve(secret, keys / "allowed", strict_keys=True)
    assert str(refused.value) == (f"server secret key file {str(secret)!r} has mode 0644, open to group or others: "
                                  f"run chmod 600 {secret} (refused under --strict-keys)")
    os.chmod(keys / "lax.key_secret", 0o620)  # written by the group counts too, as for ssh
    with pytest.raises(CurveKeyError, match="client secret key file .*lax.key_secret.* has mode 0620"):
        load_client_curve(keys / "server.key", keys / "lax.key_secret", strict_keys=True)
    load_client_curve(keys / "server.key", keys / "good.key_secret", strict_keys=True)  # 0600: fine
    assert capsys.readouterr().err == ""


def _run(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True, timeout=120)


@pytest.mark.integration
def test_strict_keys_refuses_an_open_secret_key_in_every_cli(keys, tmp_path):
    os.chmod(keys / "server.key_secret", 0o640)
    learner = _run("learner", "--run-dir", str(tmp_path / "run"), "--strict-keys",
                   "--curve-secret-key", str(keys / "server.key_secret"),
                   "--curve-allowed-clients", str(keys / "allowed"))
    assert learner.returncode == 2
    assert learner.stderr == (f"python -m learner: error: server secret key file "
                              f"{str(keys / 'server.key_secret')!r} has mode 0640, open to group or others: run "
                              f"chmod 600 {keys / 'server.key_secret'} (refused under --strict-keys)\n")
    assert not (tmp_path / "run").exists()
    os.chmod(keys / "lax.key_secret", 0o604)
    actors = _run("actors", "--strict-keys", "--curve-server-key", str(keys / "server.key"),
                  "--curve-client-key", str(keys / "lax.key_secret"))
    assert actors.returncode == 2
    assert actors.stderr == (f"python -m actors: error: client secret key file {str(keys / 'lax.key_secret')!r} has "
                             f"mode 0604, open to group or others: run chmod 600 {keys / 'lax.key_secret'} (refused "
                             f"under --strict-keys)\n")
    pool = _run("learner.pool.server", "--run-dir", str(tmp_path / "run"), "--strict-keys",
                "--curve-secret-key", str(keys / "server.key_secret"), "--curve-allowed-clients", str(keys / "allowed"))
    assert pool.returncode == 2
    assert pool.stderr == (f"python -m learner.pool.server: error: server secret key file "
                           f"{str(keys / 'server.key_secret')!r} has mode 0640, open to group or others: run "
                           f"chmod 600 {keys / 'server.key_secret'} (refused under --strict-keys)\n")


def _link(keys, port, name, *, server_key="server.key") -> LearnerLink:
    curve = load_client_curve(keys / server_key, keys / f"{name}.key_secret")
    return LearnerLink(parse_endpoint(f"tcp://127.0.0.1:{port}"), num_workers=1, limits=Limits(), curve=curve)


def _register(link: LearnerLink, within_s: float):
    deadline = time.monotonic() + within_s
    return link.register(retry_s=1.0, should_stop=lambda: time.monotonic() > deadline)


def test_a_curve_host_against_a_learner_without_curve_is_told_so(keys):
    context = zmq.Context()
    server = context.socket(zmq.ROUTER)
    port = server.bind_to_random_port("tcp://127.0.0.1")
    link = _link(keys, port, "good")
    try:
        with pytest.raises(LearnerRefused) as refused:
            _register(link, 15)
        assert str(refused.value) == (f"the learner at tcp://127.0.0.1:{port} does not use CURVE: start it with "
                                      f"--curve-secret-key and --curve-allowed-clients, or run this host without "
                                      f"--curve-server-key and --curve-client-key")
    finally:
        link.close()
        server.close(linger=0)
        context.term()


@pytest.mark.integration
def test_a_host_with_the_wrong_server_key_stops_and_says_why(keys):
    context = zmq.Context()
    curve = load_server_curve(keys / "server.key_secret", keys / "allowed")
    guard = ZapGuard(context, curve)
    server = context.socket(zmq.ROUTER)  # a learner's control socket: a CURVE server asking ZAP about each client
    curve.apply(server)
    port = server.bind_to_random_port("tcp://127.0.0.1")
    link = _link(keys, port, "spare", server_key="other/server.key")
    wrong = public(keys / "other" / "server.key")
    log = keys / "wrong_key.log"
    try:
        began = time.monotonic()
        with pytest.raises(LearnerRefused) as refused:
            _register(link, 15)
        assert time.monotonic() - began < 15
        assert str(refused.value) == (f"the learner at tcp://127.0.0.1:{port} refused the handshake: wrong server "
                                      f"key? --curve-server-key must be the learner's server.key (the one given "
                                      f"holds {wrong})")
        os.chmod(keys / "lax.key_secret", 0o644)
        host = start("actors", "--n", "1", "--learner", f"tcp://127.0.0.1:{port}",
                     "--curve-server-key", str(keys / "other" / "server.key"),
                     "--curve-client-key", str(keys / "lax.key_secret"), log=log)
        try:
            assert host.wait(timeout=60) == 2, log.read_text()
        finally:
            kill_tree(host)
    finally:
        link.close()
        server.close(linger=0)
        guard.stop()
        context.term()
    lines = log.read_text().splitlines()
    secret = keys / "lax.key_secret"
    assert (f"WARNING: client secret key file {str(secret)!r} has mode 0644, open to group or others: run chmod 600 "
            f"{secret} (--strict-keys refuses such a file)") in lines
    assert lines[-1] == (f"python -m actors: error: the learner at tcp://127.0.0.1:{port} refused the handshake: "
                         f"wrong server key? --curve-server-key must be the learner's server.key (the one given holds "
                         f"{wrong})")


def test_failed_handshakes_followed_by_one_that_succeeds_do_not_stop_the_host(keys):
    """A learner that came back with the right key after failed handshakes (events still queued) is no error."""
    context = zmq.Context()
    impostor = context.socket(zmq.ROUTER)
    load_server_curve(keys / "other" / "server.key_secret", keys / "allowed").apply(impostor)
    port = impostor.bind_to_random_port("tcp://127.0.0.1")
    link = _link(keys, port, "good")
    server = context.socket(zmq.ROUTER)
    load_server_curve(keys / "server.key_secret", keys / "allowed").apply(server)
    try:
        time.sleep(1.0)  # several reconnects, each a failed handshake
        impostor.close(linger=0)

        def bound() -> bool:
            try:
                server.bind(f"tcp://127.0.0.1:{port}")
            except zmq.ZMQError:
                return False
            return True

        assert wait_for(bound, 5)
        # the handshake with the right server succeeds (a message queues only on a connection that completed one)
        assert wait_for(lambda: link.send_control(MessageType.HEARTBEAT) and server.poll(200), 5)
        link._check_not_refused()
        assert link.failed_handshakes == 0
    finally:
        link.close()
        server.close(linger=0)
        context.term()


@pytest.fixture(scope="module")
def curve_learner(tmp_path_factory):
    """A learner with CURVE whose server secret key file is open to others (so it warns), up until the module ends."""
    tmp = tmp_path_factory.mktemp("curve_learner")
    keys = _make_keys(tmp / "keys")
    os.chmod(keys / "server.key_secret", 0o644)
    run = Run(tmp, "--curve-secret-key", str(keys / "server.key_secret"), "--curve-allowed-clients",
              str(keys / "allowed"), "--plain")
    learner = run.learner()
    link = _link(keys, run.port, "good")
    try:
        assert _register(link, 120) is not None, run.log("learner.log")
        yield run, keys
    finally:
        link.close()
        learner.send_signal(signal.SIGTERM)
        try:
            learner.wait(timeout=60)
        finally:
            kill_tree(learner)


@pytest.mark.integration
def test_the_learner_warns_about_its_open_secret_key(curve_learner):
    run, keys = curve_learner
    secret = keys / "server.key_secret"
    assert (f"WARNING: server secret key file {str(secret)!r} has mode 0644, open to group or others: run chmod 600 "
            f"{secret} (--strict-keys refuses such a file)") in run.log("learner.log").splitlines()


@pytest.mark.integration
def test_a_learner_refuses_a_host_whose_key_was_removed(curve_learner):
    run, keys = curve_learner
    first = _link(keys, run.port, "revoked")
    try:
        assert _register(first, 30) is not None, run.log("learner.log")
    finally:
        first.close()
    (keys / "allowed" / "revoked.key").unlink()
    key = public(keys / "revoked.key")
    began = time.monotonic()
    second = _link(keys, run.port, "revoked")
    try:
        refusal = f"refused this host's CURVE key {key}: copy this host's public .key file into the learner's allowed"
        with pytest.raises(LearnerRefused, match=re.escape(refusal)):
            _register(second, 10)
        assert time.monotonic() - began < 2.5
    finally:
        second.close()
    assert wait_for(lambda: f"curve: client key {key} removed from {keys / 'allowed'}: refused from now on"
                    in run.log("learner.log"), 2), run.log("learner.log")


@pytest.mark.integration
def test_a_connected_host_whose_key_is_removed_is_dropped_and_refused_when_it_registers_again(curve_learner):
    run, keys = curve_learner
    link = _link(keys, run.port, "spare")
    try:
        assert _register(link, 30) is not None, run.log("learner.log")
        (keys / "allowed" / "spare.key").unlink()
        assert wait_for(lambda: "its CURVE key was removed from the allowed clients: dropped"
                        in run.log("learner.log"), 3), run.log("learner.log")
        link.send_heartbeat({})
        assert link.control.poll(5000)
        reply = link.recv_control()
        assert reply.type is MessageType.ERROR and reply.fields["reason"] == "not_registered"
        refusal = f"register: this host's CURVE key {public(keys / 'spare.key')} is no longer in the learner's allowed"
        with pytest.raises(LearnerRefused, match=re.escape(refusal)):
            link.register(retry_s=1.0, should_stop=lambda: False)
    finally:
        link.close()
