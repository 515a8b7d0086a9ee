"""Two hosts for real: a learner in one network namespace, actor hosts in another, over a veth link.

With CURVE the allowed host trains over a slow link, a host with an unlisted key and a host without keys are
refused and counted, and a capture of the link shows none of the protocol's plaintext markers. The same run with
``--insecure`` shows them, so the capture check can fail.
"""

from __future__ import annotations

import signal
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from protocol import PROTOCOL_TAG
from tests.netns import NamespacePair, missing_requirements
from tests.processes import kill_tree, metrics, wait_for

PORT = 5555
PLAINTEXT_MARKERS = (PROTOCOL_TAG, b"registered", b"heartbeat", b"data_endpoint", b"episode_returns")
"""Strings every plaintext run sends: the protocol tag, message type names and field names (8+ bytes each, so
encrypted traffic holds one by chance with negligible probability)."""

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(missing_requirements() is not None, reason=missing_requirements() or "")]


@pytest.fixture
def hosts():
    pair = NamespacePair()
    procs: list[subprocess.Popen] = []
    pair.procs = procs
    yield pair
    for proc in procs:
        if proc.poll() is None:
            kill_tree(proc)
    pair.remove()


def _make_keys(root: Path) -> Path:
    for args in (("server",), ("client", "good"), ("client", "unlisted")):
        subprocess.run([sys.executable, "-m", "protocol.keys", args[0], str(root), *args[1:]], check=True,
                       capture_output=True)
    allowed = root / "allowed"
    allowed.mkdir()
    shutil.copy(root / "good.key", allowed / "good.key")
    return root


def _learner_args(pair: NamespacePair, run_dir: Path, total: int) -> list[str]:
    return ["--config", "configs/cartpole.yaml", "--run-dir", str(run_dir), "--set", f"network.host={pair.learner_ip}",
            "--set", f"network.port={PORT}", "--set", "trainer.target_episode_return=null",
            "--set", f"trainer.total_timesteps={total}", "--set", "network.peer_timeout_s=5"]


def _capture(pair: NamespacePair, path: Path, log: Path) -> subprocess.Popen:
    tcpdump = shutil.which("tcpdump")
    if tcpdump is None:
        pytest.fail("tcpdump is missing: bash ops/setup.sh installs it from Debian's packages as root")
    proc = pair.start(pair.learner_ns, [tcpdump, "-i", pair.learner_dev, "-U", "-s", "0", "-Z", "root", "-w", str(path),
                                        "tcp"], log=log)
    assert wait_for(lambda: "listening on" in log.read_text(), 15), log.read_text()
    return proc


def _stop_capture(proc: subprocess.Popen, path: Path) -> bytes:
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=10)
    return path.read_bytes()


def test_curve_run_between_two_namespaces_refuses_strangers_and_shows_no_plaintext(hosts, tmp_path):
    pair = hosts
    keys = _make_keys(tmp_path / "keys")
    capture = _capture(pair, tmp_path / "curve.pcap", tmp_path / "tcpdump.log")
    pair.procs.append(capture)
    learner = pair.python(pair.learner_ns, "learner", *_learner_args(pair, tmp_path / "run", 120_000),
                          "--curve-secret-key", str(keys / "server.key_secret"),
                          "--curve-allowed-clients", str(keys / "allowed"), log=tmp_path / "learner.log")
    pair.procs.append(learner)
    assert wait_for(lambda: "listening on" in (tmp_path / "learner.log").read_text(), 60)
    assert "CURVE" in (tmp_path / "learner.log").read_text()
    learner_url = f"tcp://{pair.learner_ip}:{PORT}"

    unlisted = pair.python(pair.host_ns, "actors", "--n", "1", "--learner", learner_url,
                           "--curve-server-key", str(keys / "server.key"),
                           "--curve-client-key", str(keys / "unlisted.key_secret"), log=tmp_path / "unlisted.log")
    pair.procs.append(unlisted)
    assert unlisted.wait(timeout=60) == 2
    assert "refused this host's CURVE key" in (tmp_path / "unlisted.log").read_text()

    keyless = pair.python(pair.host_ns, "actors", "--n", "1", "--learner", learner_url, "--insecure",
                          log=tmp_path / "keyless.log")
    pair.procs.append(keyless)
    assert wait_for(lambda: "failed the CURVE handshake" in (tmp_path / "learner.log").read_text(), 30)
    keyless.send_signal(signal.SIGTERM)
    assert keyless.wait(timeout=30) == 143  # 128 + SIGTERM

    shaping = pair.shape_host_link()
    good = pair.python(pair.host_ns, "actors", "--n", "2", "--learner", learner_url,
                       "--curve-server-key", str(keys / "server.key"),
                       "--curve-client-key", str(keys / "good.key_secret"), log=tmp_path / "good.log")
    pair.procs.append(good)
    assert learner.wait(timeout=240) == 0, (shaping, (tmp_path / "learner.log").read_text()[-3000:])
    assert good.wait(timeout=30) == 0, (tmp_path / "good.log").read_text()
    records = metrics(tmp_path / "run")
    assert records and records[-1]["agent_steps"] >= 120_000
    assert records[-1]["clients_refused"] >= 2  # the unlisted key, and the keyless host's handshakes
    traffic = _stop_capture(capture, tmp_path / "curve.pcap")
    assert len(traffic) > 100_000  # the training run's rows crossed the link
    found = [marker for marker in PLAINTEXT_MARKERS if marker in traffic]
    assert found == [], f"plaintext protocol markers on the CURVE link: {found}"


def test_insecure_run_between_two_namespaces_shows_plaintext(hosts, tmp_path):
    pair = hosts
    capture = _capture(pair, tmp_path / "plain.pcap", tmp_path / "tcpdump.log")
    pair.procs.append(capture)
    learner = pair.python(pair.learner_ns, "learner", *_learner_args(pair, tmp_path / "run", 30_000), "--insecure",
                          log=tmp_path / "learner.log")
    host = pair.python(pair.host_ns, "actors", "--n", "1", "--learner", f"tcp://{pair.learner_ip}:{PORT}",
                       "--insecure", log=tmp_path / "host.log")
    pair.procs += [learner, host]
    assert learner.wait(timeout=180) == 0, (tmp_path / "learner.log").read_text()[-3000:]
    assert host.wait(timeout=30) == 0
    assert "WITHOUT encryption" in (tmp_path / "learner.log").read_text()
    assert "WITHOUT encryption" in (tmp_path / "host.log").read_text()
    traffic = _stop_capture(capture, tmp_path / "plain.pcap")
    assert all(marker in traffic for marker in PLAINTEXT_MARKERS)


def test_a_learner_beyond_loopback_without_keys_or_insecure_refuses_to_start(hosts, tmp_path):
    pair = hosts
    learner = pair.python(pair.learner_ns, "learner", *_learner_args(pair, tmp_path / "run", 30_000),
                          log=tmp_path / "learner.log")
    pair.procs.append(learner)
    assert learner.wait(timeout=60) == 2
    out = (tmp_path / "learner.log").read_text()
    assert f"would bind tcp://{pair.learner_ip}:{PORT}, beyond loopback" in out
    assert "--curve-secret-key FILE --curve-allowed-clients DIR" in out and "--insecure" in out
    assert not (tmp_path / "run").exists()  # nothing half-made left behind
