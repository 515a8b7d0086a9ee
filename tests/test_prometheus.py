"""A real Prometheus (Debian's package) scrapes a real learner and two actor hosts with the shipped config and
alert rules: every target is up, both hosts were discovered through the learner, agent steps rise, and killing
one host fires SluiceActorHostLost. The query answers are printed (pytest -s shows them).

The shipped ops/prometheus/ files are copied and changed in three things only: the learner's address (a free
port here instead of 5558), 1 s scrape and evaluation intervals instead of 5 s, and 1 s discovery refresh.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from actors.shm import unlink
from tests.processes import REPO, Run, alive, kill_tree, shm_segments, wait_for

PEER_TIMEOUT_S = 3
SHIPPED = REPO / "ops" / "prometheus"


def prometheus_binary() -> str | None:
    return shutil.which("prometheus")


if prometheus_binary() is None and os.environ.get("CI"):
    pytest.fail("prometheus missing: bash ops/setup.sh installs Debian's prometheus as root", pytrace=False)
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(prometheus_binary() is None,
                                 reason="prometheus missing: run bash ops/setup.sh as root (installs Debian's prometheus)")]


def shipped_config_for(learner_metrics: str, into: Path) -> Path:
    """The shipped config dir copied into ``into``, pointed at ``learner_metrics`` with 1 s intervals."""
    shutil.copytree(SHIPPED, into)
    config = into / "prometheus.yml"
    text = config.read_text()
    for old, new in (("127.0.0.1:5558", learner_metrics), ("scrape_interval: 5s", "scrape_interval: 1s"),
                     ("evaluation_interval: 5s", "evaluation_interval: 1s"),
                     ("refresh_interval: 5s", "refresh_interval: 1s")):
        assert old in text, f"the shipped prometheus.yml no longer has {old!r}"
        text = text.replace(old, new)
    config.write_text(text)
    return config


class PrometheusApi:
    """Prometheus' HTTP API at ``base``."""

    def __init__(self, base: str) -> None:
        self.base = base

    def get(self, path: str, **params: str) -> dict:
        url = f"{self.base}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        with urllib.request.urlopen(url, timeout=5) as reply:
            body = json.loads(reply.read())
        assert body["status"] == "success", body
        return body["data"]

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base}/-/ready", timeout=2) as reply:
                return reply.status == 200
        except OSError:
            return False

    def targets(self) -> list[dict]:
        return self.get("/api/v1/targets", state="active")["activeTargets"]

    def query(self, expr: str) -> list[dict]:
        return self.get("/api/v1/query", query=expr)["result"]

    def alerts(self) -> list[dict]:
        return self.get("/api/v1/alerts")["alerts"]


@pytest.fixture
def run(tmp_path):
    r = Run(tmp_path)
    yield r
    r.close()


def test_prometheus_scrapes_learner_and_discovered_hosts_and_fires_host_lost(run, tmp_path):
    learner_metrics = f"127.0.0.1:{run.port + 3}"
    config = shipped_config_for(learner_metrics, tmp_path / "prometheus")
    prometheus_port = free_port()
    learner = run.learner("--set", "trainer.target_episode_return=null", "--set", "trainer.total_timesteps=50000000",
                          "--set", f"network.peer_timeout_s={PEER_TIMEOUT_S}")
    hosts = [run.actors(1, log="a1.log"), run.actors(1, log="a2.log")]
    doomed_workers = run.note_workers(hosts[1])
    run.note_workers(hosts[0])
    with (tmp_path / "prometheus.log").open("w") as log:
        prometheus = subprocess.Popen(
            [prometheus_binary(), f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{prometheus_port}"],
            cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    run.procs.append(prometheus)
    api = PrometheusApi(f"http://127.0.0.1:{prometheus_port}")
    assert wait_for(api.ready, 60), run.log("prometheus.log")

    def all_up() -> bool:
        targets = api.targets()
        jobs = [t["labels"]["job"] for t in targets]
        return (jobs.count("sluice_learner") == 1 and jobs.count("sluice_actor_hosts") == 2
                and all(t["health"] == "up" for t in targets))

    assert wait_for(all_up, 90, interval=0.5), json.dumps(api.targets(), indent=1) + run.log("learner.log")
    targets = api.targets()
    print("targets:", [(t["labels"]["job"], t["labels"].get("host", ""), t["scrapeUrl"], t["health"])
                       for t in targets])
    discovered = {t["labels"]["host"] for t in targets if t["labels"]["job"] == "sluice_actor_hosts"}
    assert all(f"actor host {name} joined" in run.log("learner.log") for name in discovered), discovered

    def steps_rate() -> list[dict]:
        return api.query("rate(sluice_agent_steps_total[10s])")

    assert wait_for(lambda: any(float(r["value"][1]) > 0 for r in steps_rate()), 60, interval=0.5), steps_rate()
    print("rate(sluice_agent_steps_total[10s]) =", [(r["metric"]["instance"], r["value"][1]) for r in steps_rate()])
    def host_rates() -> list[dict]:
        return api.query("sum by (host) (rate(sluice_actor_env_steps_total[10s]))")

    assert wait_for(lambda: len(host_rates()) == 2, 30, interval=0.5), host_rates()
    print("sum by (host) (rate(sluice_actor_env_steps_total[10s])) =", [(r["metric"]["host"], r["value"][1])
                                                                       for r in host_rates()])
    assert wait_for(lambda: len(api.query("sluice_build_info")) == 3, 30), api.query("sluice_build_info")
    assert not [a for a in api.alerts() if a["labels"]["alertname"] == "SluiceActorHostLost"]

    kill_tree(hosts[1])  # SIGKILL to a host and its workers: no BYE, as a machine that loses power
    assert wait_for(lambda: not any(alive(pid) for pid in doomed_workers), 10)
    for name in shm_segments(hosts[1].pid):  # what the host's next start would remove
        unlink(name)

    def host_lost_firing() -> list[dict]:
        return [a for a in api.alerts() if a["labels"]["alertname"] == "SluiceActorHostLost" and a["state"] == "firing"]

    assert wait_for(lambda: bool(host_lost_firing()), 60 + PEER_TIMEOUT_S, interval=0.5), \
        json.dumps(api.alerts(), indent=1) + run.log("learner.log")
    print("fired:", json.dumps(host_lost_firing()))
    assert wait_for(lambda: sum(t["labels"]["job"] == "sluice_actor_hosts" for t in api.targets()) == 1, 30), \
        "the lost host must leave discovery"

    prometheus.send_signal(signal.SIGTERM)
    assert prometheus.wait(timeout=30) == 0, run.log("prometheus.log")
    learner.send_signal(signal.SIGTERM)
    assert learner.wait(timeout=30) == 143, run.log("learner.log")
    assert hosts[0].wait(timeout=30) == 0, run.log("a1.log")
    run.procs.remove(hosts[1])  # killed on purpose above; its workers were checked
    run.assert_clean()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
