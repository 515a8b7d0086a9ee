"""The Slurm recipe for real (issue 32): a one-node Slurm cluster from Debian's packages (slurm-wlm, munge), started
by the test as root, runs ops/slurm/sluice.sbatch with sbatch.

The cluster lives in a temporary directory and touches nothing under /etc: its own munge key and socket (munged
wants every directory above its socket searchable by all, hence /tmp and not pytest's 0700 tmp_path), a slurm.conf
for this host alone (SlurmctldHost and NodeName this host's short name at 127.0.0.1, its CPUs,
proctrack/linuxproc, task/none, select/cons_tres, state and spool directories in the temporary directory, free
ports), and SLURM_CONF pointing the commands at it. munged, slurmctld and slurmd are started once for the module and
stopped (by their pid files) after.

Every process of a job is noted while it runs (its environment holds SLURM_JOB_ID), so the test can check that none
is left after the job and that none left a /dev/shm/sluice_* segment.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.processes import REPO, alive, free_ports, metrics, shm_segments, wait_for

RECIPE = REPO / "ops" / "slurm" / "sluice.sbatch"
TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sinfo")


def tool(name: str) -> str | None:
    """The path of a Slurm or munge program (root's PATH may lack /usr/sbin), None when missing."""
    found = shutil.which(name)
    if found is None and Path("/usr/sbin", name).exists():
        found = f"/usr/sbin/{name}"
    return found


def missing_requirements() -> str | None:
    """Why a one-node Slurm cannot be started here (None when it can)."""
    if sys.platform != "linux" or os.geteuid() != 0:
        return "a one-node Slurm cluster needs root (CI runs as root)"
    missing = [name for name in TOOLS if tool(name) is None]
    if missing:
        return (f"{', '.join(missing)} missing: bash ops/setup.sh installs Debian's slurm-wlm and munge when run as "
                f"root")
    return None


if missing_requirements() is not None and os.environ.get("CI") and os.geteuid() == 0:
    pytest.fail(missing_requirements(), pytrace=False)  # CI installs them (ops/setup.sh): this test must run there
pytestmark = [pytest.mark.integration, pytest.mark.slow,
              pytest.mark.skipif(missing_requirements() is not None, reason=missing_requirements() or "")]


class OneNodeSlurm:
    """munged, slurmctld and slurmd for this host, from a temporary directory; ``env`` points Slurm's commands at
    it."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="sluice-slurm-", dir="/tmp"))
        self.dir.chmod(0o755)
        self.node = socket.gethostname().split(".")[0]
        self.pid_files = {name: self.dir / f"{name}.pid" for name in ("slurmd", "slurmctld", "munged")}
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM")},
                    "SLURM_CONF": str(self.dir / "slurm.conf")}
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        munge = self.dir / "munge"
        munge.mkdir(mode=0o700)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        socket_dir = self.dir / "socket"
        socket_dir.mkdir(mode=0o755)
        self.munge_socket = socket_dir / "munge.socket"
        self._daemon([tool("munged"), f"--key-file={key}", f"--socket={self.munge_socket}",
                      f"--pid-file={self.pid_files['munged']}", f"--log-file={munge / 'munged.log'}",
                      f"--seed-file={munge / 'munged.seed'}"], munge / "munged.log")
        for name in ("state", "spool", "log"):
            (self.dir / name).mkdir()
        ctld_port = free_ports(2)
        cpus = os.cpu_count() or 1
        (self.dir / "slurm.conf").write_text("\n".join([
            "ClusterName=sluicetest",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={ctld_port + 1}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            f"StateSaveLocation={self.dir / 'state'}",
            f"SlurmdSpoolDir={self.dir / 'spool'}",
            f"SlurmctldPidFile={self.pid_files['slurmctld']}",
            f"SlurmdPidFile={self.pid_files['slurmd']}",
            f"SlurmctldLogFile={self.dir / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={self.dir / 'log' / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/builtin",
            "MpiDefault=none",
            "ReturnToService=2",
            "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "KillWait=30",
            "MinJobAge=600",  # scontrol show job answers for finished jobs this long
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=1000 State=UNKNOWN",
            f"PartitionName=sluice Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
        ]) + "\n")
        self._daemon([tool("slurmctld"), "-i"], self.dir / "log" / "slurmctld.log")
        self._daemon([tool("slurmd")], self.dir / "log" / "slurmd.log")
        if not wait_for(lambda: "idle" in self.run("sinfo", "-h", "-o", "%T", check=False).stdout, 60, 0.5):
            raise RuntimeError(f"the Slurm node did not become idle in 60 s:\n{self.logs()}")

    def _daemon(self, argv: list, log: Path) -> None:
        """Start a daemon that forks into the background; raise with its log when it fails to."""
        done = subprocess.run([str(a) for a in argv], env=self.env, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            text = log.read_text() if log.exists() else ""
            raise RuntimeError(f"{argv[0]} failed to start ({done.returncode}): {done.stderr}{done.stdout}{text}")

    def run(self, *argv: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
        """A Slurm command against this cluster."""
        return subprocess.run([tool(argv[0]), *argv[1:]], env={**self.env, **kwargs.pop("env", {})}, cwd=REPO,
                              capture_output=True, text=True, check=check, timeout=60, **kwargs)

    def job(self, job_id: str) -> dict[str, str]:
        """scontrol show job's fields."""
        text = self.run("scontrol", "show", "job", "-o", job_id).stdout
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def logs(self) -> str:
        return "".join(f"--- {path.name}\n{path.read_text()[-3000:]}" for path in sorted(self.dir.rglob("*.log")))

    def stop(self) -> None:
        """Stop slurmd, slurmctld and munged (by their pid files); remove the directory."""
        for name in ("slurmd", "slurmctld", "munged"):
            try:
                pid = int(self.pid_files[name].read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            if not wait_for(lambda: not alive(pid), 20, 0.2):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def slurm():
    cluster = OneNodeSlurm()
    yield cluster
    cluster.stop()


def job_pids(job_id: str) -> set[int]:
    """Live processes of Slurm job ``job_id`` (their environment holds SLURM_JOB_ID=job_id)."""
    needle = f"SLURM_JOB_ID={job_id}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    found.add(int(entry.name))
            except OSError:
                continue
    return found


class Job:
    """One sbatch of the recipe, its processes noted while it runs."""

    def __init__(self, slurm: OneNodeSlurm, tmp_path: Path, *learner_args: str, output: str = "job.out",
                 **settings: str) -> None:
        self.slurm, self.tmp = slurm, tmp_path
        self.run_dir = tmp_path / "run"
        self.keys = tmp_path / "keys"
        self.out = tmp_path / output
        self.port = free_ports(8)
        env = {"SLUICE_PYTHON": sys.executable, "SLUICE_RUN_DIR": str(self.run_dir), "SLUICE_KEYS_DIR": str(self.keys),
               "SLUICE_PORT": str(self.port), "SLUICE_HOST_GRACE_S": "30", **settings}
        self.id = slurm.run("sbatch", "--parsable", f"--output={self.out}", str(RECIPE), *learner_args,
                            env=env).stdout.strip().split(";")[0]
        self.pids: set[int] = set()
        self.started = time.monotonic()

    def note(self) -> None:
        self.pids |= job_pids(self.id)

    def queued(self) -> bool:
        self.note()
        return bool(self.slurm.run("squeue", "-h", "-j", self.id, check=False).stdout.strip())

    def wait_until(self, predicate, timeout: float) -> bool:
        return wait_for(lambda: (self.note(), predicate())[1], timeout, 0.2)

    def wait(self, timeout: float) -> dict[str, str]:
        assert wait_for(lambda: not self.queued(), timeout, 0.2), f"job {self.id} still queued\n{self.logs()}"
        print(f"job {self.id} ended {time.monotonic() - self.started:.1f} s after sbatch")
        return self.slurm.job(self.id)

    def output(self) -> str:
        return self.out.read_text() if self.out.exists() else ""

    def host_logs(self) -> str:
        return "".join(path.read_text() for path in sorted((self.run_dir / "slurm").glob("actors-*.log")))

    def logs(self) -> str:
        return f"{self.output()[-6000:]}\n--- actor hosts\n{self.host_logs()[-3000:]}\n{self.slurm.logs()}"

    def assert_clean(self) -> None:
        """No process of the job left, and no /dev/shm/sluice_* segment any of them owned."""
        assert self.pids, "no process of the job was seen"
        assert wait_for(lambda: not any(alive(pid) for pid in self.pids), 30), \
            f"processes left: {sorted(pid for pid in self.pids if alive(pid))}"
        assert not [name for pid in self.pids for name in shm_segments(pid)], "leaked shared memory"

    def cancel(self) -> None:
        if self.queued():
            self.slurm.run("scancel", self.id, check=False)


@pytest.fixture
def jobs(slurm):
    started: list[Job] = []
    yield started
    for job in started:
        job.cancel()


def final_checkpoint_update(run_dir: Path) -> int:
    """The update number of the newest checkpoint with its weights."""
    names = sorted(p.parent.name for p in (run_dir / "checkpoints").glob("update_*/model.safetensors"))
    assert names, f"no checkpoint in {run_dir}"
    return int(names[-1].removeprefix("update_"))


def test_a_job_with_a_small_budget_trains_over_curve_and_ends_cleanly(slurm, jobs, tmp_path):
    """One node: the learner and an actor host (srun) beside it, keys made on the shared directory, the budget
    reached: the learner exits 0 with its final checkpoint, the host exits 0, and the job is COMPLETED 0:0. A second
    job on the same run directory continues it (here: finds it finished) with the same keys."""
    job = Job(slurm, tmp_path, "--set", "trainer.total_timesteps=16384", "--set", "run.checkpoint_interval=1000")
    jobs.append(job)
    info = job.wait(240)
    out = job.output()
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), job.logs()
    assert f"on {slurm.node}, tcp://{slurm.node}:{job.port}" in out, out  # the first node's name goes to the hosts
    assert re.search(r"listening on tcp://0\.0\.0\.0:\d+ .*CURVE", out), out
    assert "learner: stopped (total_timesteps reached); final checkpoint in" in out, job.logs()
    assert "sluice.sbatch: learner exited with 0" in out and "sluice.sbatch: actor hosts exited with 0" in out
    assert "actors: stopped (learner: total_timesteps reached)" in job.host_logs(), job.logs()
    records = metrics(job.run_dir)
    assert records and final_checkpoint_update(job.run_dir) == records[-1]["update"]  # the final checkpoint
    # the keys were made once, secrets 0600, the hosts' public key allowed
    for secret in ("server.key_secret", "slurm-hosts.key_secret"):
        assert (job.keys / secret).stat().st_mode & 0o777 == 0o600
    assert (job.keys / "allowed" / "slurm-hosts.key").read_text() == (job.keys / "slurm-hosts.key").read_text()
    job.assert_clean()
    keys = {path.name: path.read_text() for path in job.keys.glob("*.key*")}

    # Submitted again on the same run directory: the run is continued (--resume), finds itself finished and exits
    # 0 without binding; the actor host, waiting for a learner that never comes, is stopped after the grace.
    again = Job(slurm, tmp_path, "--set", "trainer.total_timesteps=16384", output="again.out", SLUICE_HOST_GRACE_S="3")
    jobs.append(again)
    info = again.wait(120)
    out = again.output()
    assert (info["JobState"], info["ExitCode"]) == ("COMPLETED", "0:0"), again.logs()
    assert f"sluice.sbatch: continuing the run in {job.run_dir}" in out, again.logs()
    assert "nothing to resume, nothing started" in out, again.logs()
    assert "actor hosts still running 3 s after the learner: stopping them" in out, again.logs()
    assert {path.name: path.read_text() for path in job.keys.glob("*.key*")} == keys  # the keys were kept
    again.assert_clean()


@pytest.mark.parametrize("stop", ["scancel", "time limit signal"])
def test_a_stopped_job_checkpoints_with_two_ranks_under_torchrun(slurm, jobs, tmp_path, stop):
    """Two learner ranks under torchrun, two actor hosts, no budget; stopped after two updates by ``scancel`` (SIGTERM
    to every process of the job) or by what the time limit sends (--signal=B:TERM: SIGTERM to the batch script,
    which passes it to the learner, which tells the hosts). Either way: a final checkpoint of the last update, the
    hosts stop, nothing is left behind."""
    job = Job(slurm, tmp_path, "--set", "trainer.target_episode_return=null",
              SLUICE_RANKS="2", SLUICE_HOSTS_PER_NODE="2", SLUICE_WORKERS="1")
    jobs.append(job)
    assert job.wait_until(lambda: len(metrics(job.run_dir)) >= 2, 240), job.logs()
    if stop == "scancel":
        slurm.run("scancel", job.id)
    else:
        slurm.run("scancel", "--batch", "--signal=TERM", job.id)
    info = job.wait(120)
    out = job.output()
    assert "learner rank 1 of 2: data socket bound" in out, job.logs()
    assert "sluice.sbatch: TERM received: stopping the learner" in out, job.logs()
    assert "learner: stopped (SIGTERM received); final checkpoint in" in out, job.logs()
    assert "learner rank 1: stopped" in out, job.logs()
    assert final_checkpoint_update(job.run_dir) == metrics(job.run_dir)[-1]["update"]
    hosts = job.host_logs()
    assert hosts.count("actors: stopped") == 2, job.logs()
    if stop == "scancel":
        assert info["JobState"] == "CANCELLED", job.logs()
    else:  # the learner told the hosts to stop: they exit 0; torchrun reports its ranks stopped by a signal as 1
        assert "sluice.sbatch: actor hosts exited with 0" in out, job.logs()
        assert hosts.count("actors: stopped (learner: SIGTERM received)") == 2, job.logs()
        assert (info["JobState"], info["ExitCode"]) == ("FAILED", "1:0"), job.logs()
    job.assert_clean()
