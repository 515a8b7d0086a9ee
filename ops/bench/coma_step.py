"""Benchmark: the wall-clock of one COMA gradient step (``Coma.train_step``: critic, every actor, soft target
updates) on simple_spread's shapes, the cost that bounds COMA's learner on a small machine.

Random minibatches of ``coma.batch_size`` joint transitions (3 agents, the shapes of the built-in simple_spread), one
process, ``--threads`` torch threads; after ``--warmup`` steps it times ``--steps`` steps ``--repeats`` times and
reports the best and the median milliseconds per step. ``--set coma.KEY=VALUE`` changes the coma section (e.g. the
hidden sizes or the batch size). Usage:
.venv/bin/python -m ops.bench.coma_step [--threads 1] [--steps 300] [--repeats 3] [--set coma.batch_size=128]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from configs.loader import load_config
from envs.builtin.simple_spread import SimpleSpreadVec
from learner.coma.algorithm import Coma, transition_fields
from ops.benchlib import emit
from policies.team_actors import team_shapes

AGENTS = 3


def random_minibatch(model: Coma, size: int, rng: np.random.Generator) -> dict[str, torch.Tensor]:
    """``size`` transitions of random values, the behaviour log-probabilities the model's own (fresh data)."""
    fields = transition_fields(model.shapes)
    data = {name: rng.uniform(-1.0, 1.0, (size, *shape)).astype(np.float32) for name, (shape, _) in fields.items()}
    data["terminated"] = (rng.random(size) < 0.04).astype(np.float32)  # one step in 25 ends an episode
    pre_tanh, actions, logprobs = model.act(data["obs"])
    data.update(pre_tanh=pre_tanh, actions=actions, logprobs=logprobs)
    return {name: torch.from_numpy(values) for name, values in data.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--steps", type=int, default=300, help="gradient steps per timed repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="coma.KEY=VALUE")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    section = load_config(None, args.overrides).coma
    model = Coma(team_shapes(SimpleSpreadVec(1, num_agents=AGENTS).spec), section, seed=1,
                 device=torch.device("cpu"))
    minibatch = random_minibatch(model, section.batch_size, np.random.default_rng(1))
    for _ in range(args.warmup):
        model.train_step(minibatch)
    per_step_ms = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        for _ in range(args.steps):
            model.train_step(minibatch)
        per_step_ms.append((time.perf_counter() - started) / args.steps * 1e3)
    emit({"bench": "coma_step", "threads": args.threads, "batch_size": section.batch_size,
          "hidden_sizes": section.hidden_sizes, "fused_adam": bool(model.actor_optimizer.defaults.get("fused")),
          "steps": args.steps, "ms_per_step_best": round(min(per_step_ms), 3),
          "ms_per_step_median": round(statistics.median(per_step_ms), 3)})


if __name__ == "__main__":
    main()
