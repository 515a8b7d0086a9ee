"""Experiment: the token encoder against the flat MLP on an adapted env with padded token-list observations.

``configs/token_cue.yaml`` (examples/token_cue.py, a Gymnasium vector env declared with ``env.tokens``) is trained
through the real pipeline (``pipeline_run.trained_run``: learner and actor host processes) for the same agent-step
budget with ``model.encoder`` tokens (what ``auto`` picks for the declared layout) and mlp (the flattened rows, padding
included), per seed. It prints one JSON object per run: the mean episode return and explained variance of the last 5
updates (the best return is 32, a random policy's about 8). Usage:
.venv/bin/python -m ops.experiments.token_cue [--seeds 1 2] [--agent-steps 200000] [--port 6500]
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from statistics import mean

from ops.benchlib import emit, run_stoppable
from ops.experiments.pipeline_run import trained_run

ENCODERS = ("tokens", "mlp")
LAST_UPDATES = 5
"""Updates at the end of a run whose figures are averaged."""


def score(metrics_lines: list[str]) -> dict[str, float | int | None]:
    """The last LAST_UPDATES updates' mean return and explained variance, the updates and agent steps done."""
    records = [json.loads(line) for line in metrics_lines if line.strip()]
    if not records:
        return {"updates": 0, "agent_steps": 0, "return_mean": None, "explained_variance": None}
    last = records[-LAST_UPDATES:]
    returns = [r["episode_return_mean"] for r in last if r.get("episode_return_mean") is not None]
    variances = [r["explained_variance"] for r in last if r.get("explained_variance") is not None]
    return {"updates": records[-1]["update"], "agent_steps": records[-1]["agent_steps"],
            "return_mean": round(mean(returns), 2) if returns else None,
            "explained_variance": round(mean(variances), 3) if variances else None}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--agent-steps", type=int, default=200_000, help="the step budget of every run")
    parser.add_argument("--seconds", type=float, default=300.0, help="wall-clock cap of one run")
    parser.add_argument("--port", type=int, default=6500)
    args = parser.parse_args(argv)
    for seed in args.seeds:
        for encoder in ENCODERS:
            overrides = [f"model.encoder={encoder}", f"trainer.total_timesteps={args.agent_steps}",
                         "trainer.target_episode_return=null"]
            with trained_run(config="token_cue", seed=seed, seconds=args.seconds, port=args.port,
                             overrides=overrides) as run:
                figures = score((run.run_dir / "metrics.jsonl").read_text().splitlines())
                emit({"experiment": "token_cue", "seed": seed, "encoder": encoder, "budget": args.agent_steps,
                      **figures, "learner_exit_code": run.learner_exit_code})


if __name__ == "__main__":
    run_stoppable(main)
