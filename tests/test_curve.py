"""CurveZMQ keys, the bind rule and the ZAP allow-list, over real ZeroMQ sockets; the CLIs' security errors."""

from __future__ import annotations

import logging
import shutil
import stat
import subprocess
import sys

import pytest
import zmq

from protocol.bind_rule import InsecureEndpointError, client_curve_for, server_curve_for
from protocol.curve import CurveKeyError, ZapGuard, load_client_curve, load_server_curve
from protocol.endpoints import parse_endpoint
from protocol.keys import main as keys_main
from tests.processes import REPO, wait_for

SERVER_OPTIONS = "--curve-secret-key FILE --curve-allowed-clients DIR"
CLIENT_OPTIONS = "--curve-server-key server.key --curve-client-key NAME.key_secret"


@pytest.fixture
def keys(tmp_path):
    root = tmp_path / "keys"
    assert keys_main(["server", str(root)]) == 0
    for name in ("good", "unlisted"):
        assert keys_main(["client", str(root), name]) == 0
    (root / "allowed").mkdir()
    shutil.copy(root / "good.key", root / "allowed" / "good.key")
    return root


def test_key_files_are_pyzmq_certificates_and_the_secret_one_is_private(keys):
    assert stat.S_IMODE((keys / "server.key_secret").stat().st_mode) == 0o600
    assert stat.S_IMODE((keys / "server.key").stat().st_mode) == 0o644
    public, secret = zmq.auth.load_certificate(keys / "server.key_secret")
    assert len(public) == len(secret) == 40
    assert zmq.auth.load_certificate(keys / "server.key") == (public, None)


def test_keys_cli_refuses_to_overwrite_and_checks_names(keys, capsys):
    assert keys_main(["client", str(keys), "good"]) == 2
    assert "good.key exists; refusing to overwrite a key" in capsys.readouterr().err
    assert keys_main(["client", str(keys), "../evil"]) == 2
    assert "key name '../evil' must be 1-64 letters" in capsys.readouterr().err


def test_key_loading_errors_name_the_file_and_the_fix(keys, tmp_path):
    with pytest.raises(CurveKeyError, match="server secret key file .*nope.* is not a CURVE key file"):
        load_server_curve(tmp_path / "nope", keys / "allowed")
    with pytest.raises(CurveKeyError, match="holds only a public key; pass the .key_secret file"):
        load_server_curve(keys / "server.key", keys / "allowed")
    with pytest.raises(CurveKeyError, match="allowed clients directory .*missing.* does not exist"):
        load_server_curve(keys / "server.key_secret", tmp_path / "missing")
    (tmp_path / "junk.key").write_text("not a key\n")
    with pytest.raises(CurveKeyError, match="junk.key.* is not a CURVE key file"):
        load_client_curve(tmp_path / "junk.key", keys / "good.key_secret")


def test_the_bind_rule(keys, capsys):
    loopback, wide = parse_endpoint("tcp://127.0.0.1:5555"), parse_endpoint("tcp://0.0.0.0:5555")
    assert server_curve_for(loopback, secret_key="", allowed_clients="", insecure=False, who="w",
                            key_options=SERVER_OPTIONS) is None
    with pytest.raises(InsecureEndpointError, match=f"w would bind tcp://0.0.0.0:5555, beyond loopback.*pass "
                                                    f"{SERVER_OPTIONS} .*or --insecure"):
        server_curve_for(wide, secret_key="", allowed_clients="", insecure=False, who="w", key_options=SERVER_OPTIONS)
    assert server_curve_for(wide, secret_key="", allowed_clients="", insecure=True, who="w",
                            key_options=SERVER_OPTIONS) is None
    assert "WITHOUT encryption or authentication (--insecure)" in capsys.readouterr().err
    curve = server_curve_for(loopback, secret_key=str(keys / "server.key_secret"),
                             allowed_clients=str(keys / "allowed"), insecure=False, who="w", key_options=SERVER_OPTIONS)
    assert curve is not None and curve.public == zmq.auth.load_certificate(keys / "server.key")[0]
    with pytest.raises(InsecureEndpointError, match="needs both"):
        server_curve_for(wide, secret_key=str(keys / "server.key_secret"), allowed_clients="", insecure=False,
                         who="w", key_options=SERVER_OPTIONS)
    with pytest.raises(InsecureEndpointError, match=f"--learner tcp://10.1.2.3:5555 is beyond loopback: pass "
                                                    f"{CLIENT_OPTIONS}"):
        client_curve_for(parse_endpoint("tcp://10.1.2.3:5555"), server_key="", client_key="", insecure=False,
                         who="--learner", key_options=CLIENT_OPTIONS)
    with pytest.raises(InsecureEndpointError, match="needs both"):
        client_curve_for(loopback, server_key=str(keys / "server.key"), client_key="", insecure=False,
                         who="--learner", key_options=CLIENT_OPTIONS)


def _client(context, keys, name, port):
    sock = context.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if name is not None:
        load_client_curve(keys / "server.key", keys / f"{name}.key_secret").apply(sock)
    sock.connect(f"tcp://127.0.0.1:{port}")
    return sock


def test_zap_allows_listed_keys_and_counts_and_logs_refusals_once(keys, caplog):
    caplog.set_level(logging.WARNING, logger="sluice.protocol.curve")
    server_context, client_context = zmq.Context(), zmq.Context()
    curve = load_server_curve(keys / "server.key_secret", keys / "allowed")
    guard = ZapGuard(server_context, curve)
    server = server_context.socket(zmq.ROUTER)
    try:
        curve.apply(server)
        guard.watch(server, "control")
        guard.start_watching()
        port = server.bind_to_random_port("tcp://127.0.0.1")
        good = _client(client_context, keys, "good", port)
        good.send(b"hello")
        assert server.poll(5000)
        frames = server.recv_multipart(copy=False)
        assert frames[-1].bytes == b"hello"
        assert frames[-1].get("User-Id") == curve_public(keys / "good.key")
        for _ in range(3):
            stranger = _client(client_context, keys, "unlisted", port)
            stranger.send(b"let me in")
            assert wait_for(lambda: guard.refused_keys() == 1, 5)
            stranger.close(linger=0)
        plaintext = _client(client_context, keys, None, port)
        plaintext.send(b"no keys")
        assert wait_for(lambda: guard.handshake_failures["control"] >= 1, 5)
        assert not server.poll(300)  # neither stranger got through
        assert guard.refused() >= 3 + 1
        refusals = [r for r in caplog.records if "refused a CURVE client" in r.getMessage()]
        assert len(refusals) == 1 and curve_public(keys / "unlisted.key") in refusals[0].getMessage()
        # a key added to the directory later is allowed without a restart
        shutil.copy(keys / "unlisted.key", keys / "allowed" / "unlisted.key")
        late = _client(client_context, keys, "unlisted", port)
        late.send(b"now")
        assert server.poll(5000)
        for sock in (good, plaintext, late):
            sock.close(linger=0)
    finally:
        server.close(linger=0)
        guard.stop()
        server_context.term()
        client_context.term()


def curve_public(path) -> str:
    return zmq.auth.load_certificate(path)[0].decode("ascii")


def _run(module: str, *args: str, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.integration
def test_learner_cli_security_errors(tmp_path, keys):
    wide = _run("learner", "--run-dir", str(tmp_path / "run"), "--set", "network.host=0.0.0.0")
    assert wide.returncode == 2
    assert wide.stderr.startswith("python -m learner: error: the learner would bind tcp://0.0.0.0:5555, beyond "
                                  "loopback")
    assert "--curve-secret-key FILE --curve-allowed-clients DIR" in wide.stderr
    assert not (tmp_path / "run").exists()
    missing = _run("learner", "--run-dir", str(tmp_path / "run"), "--curve-secret-key", str(tmp_path / "none"),
                   "--curve-allowed-clients", str(keys / "allowed"))
    assert missing.returncode == 2 and "server secret key file" in missing.stderr and "none" in missing.stderr
    half = _run("learner", "--run-dir", str(tmp_path / "run"), "--curve-secret-key", str(keys / "server.key_secret"))
    assert half.returncode == 2 and "CURVE needs both" in half.stderr


@pytest.mark.integration
def test_actors_cli_security_errors(keys):
    remote = _run("actors", "--learner", "tcp://10.1.2.3:5555")
    assert remote.returncode == 2
    assert remote.stderr.strip() == (f"python -m actors: error: --learner tcp://10.1.2.3:5555 is beyond loopback: "
                                     f"pass {CLIENT_OPTIONS} (make them with python -m protocol.keys "
                                     f"(docs/OPERATIONS.md, Multi-host)), or --insecure if the learner runs with --insecure")
    half = _run("actors", "--curve-server-key", str(keys / "server.key"))
    assert half.returncode == 2 and "CURVE needs both" in half.stderr
    wrong = _run("actors", "--curve-server-key", str(keys / "server.key"), "--curve-client-key",
                 str(keys / "good.key"))
    assert wrong.returncode == 2 and "holds only a public key; pass the .key_secret file" in wrong.stderr


@pytest.mark.integration
def test_pool_server_cli_bind_rule(tmp_path):
    wide = _run("learner.pool.server", "--run-dir", str(tmp_path), "--bind", "tcp://0.0.0.0:5560")
    assert wide.returncode == 2
    assert "the pool server would bind tcp://0.0.0.0:5560, beyond loopback" in wide.stderr
