"""Benchmark: wall-clock and env steps until CartPole's last-100 mean return reaches 475.

Runs the real learner and one actor host (separate processes, ZeroMQ, shared memory) ``--trials`` times
and prints one JSON object per trial plus a summary. ``--ranks K`` runs the learner as K ranks under torchrun
(issue 15) and ``--hosts H`` starts H actor hosts; ``--device cuda`` runs the learner on the GPU (``--device`` of
``python -m learner``). Usage: .venv/bin/python -m ops.experiments.cartpole_to_475 [--trials 3] [--curve]
[--ranks 2 --hosts 2] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# the learner prints "agent steps" (older versions: "env steps"); env steps come from metrics.jsonl
SOLVED = re.compile(r"solved: mean return ([\d.]+) .* after ([\d,]+) (?:agent|env) steps in ([\d.]+) s")


def curve_options(keys: Path) -> tuple[list[str], list[str]]:
    """Make a server and a host key pair in ``keys``; the learner's and the host's CURVE options."""
    for args in (("server",), ("client", "host")):
        subprocess.run([sys.executable, "-m", "protocol.keys", args[0], str(keys), *args[1:]], cwd=REPO, check=True,
                       capture_output=True)
    (keys / "allowed").mkdir()
    (keys / "allowed" / "host.key").write_bytes((keys / "host.key").read_bytes())
    return (["--curve-secret-key", str(keys / "server.key_secret"), "--curve-allowed-clients", str(keys / "allowed")],
            ["--curve-server-key", str(keys / "server.key"), "--curve-client-key", str(keys / "host.key_secret")])


def learner_command(ranks: int) -> list[str]:
    """The learner's command: python -m learner, or K ranks under torchrun."""
    if ranks == 1:
        return [sys.executable, "-m", "learner"]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", "-m", "learner"]


def trial(port: int, workers: int, seed: int, curve: bool, *, ranks: int = 1, hosts: int = 1,
          device: str = "auto") -> dict:
    """One training run (with CURVE on every socket when ``curve``); returns its figures."""
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        learner_keys, host_keys = curve_options(Path(tmp, "keys")) if curve else ([], [])
        learner = subprocess.Popen([*learner_command(ranks), "--run-dir", f"{tmp}/run", "--set",
                                    f"network.port={port}", "--set", f"run.seed={seed}", "--set", f"run.device={device}",
                                    *learner_keys], cwd=REPO,
                                   env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        actors = [subprocess.Popen([sys.executable, "-m", "actors", "--n", str(workers), "--learner",
                                    f"tcp://127.0.0.1:{port}", *host_keys], cwd=REPO, env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(hosts)]
        started = time.monotonic()
        out, _ = learner.communicate(timeout=900)
        for host in actors:
            host.wait(timeout=60)
        match = SOLVED.search(out)
        metrics = Path(tmp, "run", "metrics.jsonl")
        lines = metrics.read_text().splitlines() if metrics.exists() else []
        last = json.loads(lines[-1]) if lines else {}
        return {"benchmark": "cartpole_to_475", "seed": seed, "workers": workers, "curve": curve, "ranks": ranks,
                "hosts": hosts, "device": device,
                "exit_code": learner.returncode, "solved": match is not None,
                "final_mean_return": float(match.group(1)) if match else None,
                "agent_steps": int(match.group(2).replace(",", "")) if match else None,
                "env_steps": last.get("env_steps") if match else None,
                "train_s": float(match.group(3)) if match else None,
                "process_wall_s": round(time.monotonic() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--port", type=int, default=5655)
    parser.add_argument("--curve", action="store_true", help="CURVE on every socket (keys made for the run)")
    parser.add_argument("--ranks", type=int, default=1, help="learner ranks under torchrun (1: python -m learner)")
    parser.add_argument("--hosts", type=int, default=1, help="actor hosts, each with --workers workers")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="the learner's run.device (default auto: cuda when torch sees one)")
    args = parser.parse_args()
    results = [trial(args.port, args.workers, seed, args.curve, ranks=args.ranks, hosts=args.hosts, device=args.device)
               for seed in range(1, args.trials + 1)]
    for result in results:
        print(json.dumps(result))
    solved = [r for r in results if r["solved"]]
    print(json.dumps({"benchmark": "cartpole_to_475_summary", "machine": f"{platform.node()} "
                      f"{os.cpu_count()} cores {platform.processor() or platform.machine()}",
                      "curve": args.curve, "ranks": args.ranks, "hosts": args.hosts, "device": args.device,
                      "trials": len(results),
                      "solved": len(solved),
                      "train_s": sorted(r["train_s"] for r in solved),
                      "env_steps": sorted(r["env_steps"] for r in solved if r["env_steps"] is not None)}))


if __name__ == "__main__":
    main()
