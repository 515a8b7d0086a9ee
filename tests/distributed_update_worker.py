"""One learner rank of tests/test_distributed_update.py, run as a real process: ``python -m
tests.distributed_update_worker --rank R --world-size K --init-method file://... --directory D [--stall]``.

It reads the case the test wrote to D (``batch.safetensors``, ``trainer.json``), joins the gloo group, runs one PPO
update on its share of the rows and writes its parameters (``rank<R>.safetensors``) and metrics (``rank<R>.json``).
With ``--stall`` it joins the group and then never calls a collective (a rank that hung). A collective timeout exits
with TIMEOUT_EXIT and the error on stderr, through ``os._exit``. The test imports ``make_case``, ``build_learner``
and ``run_update`` from here, so the single-process reference runs the very same code on the whole batch.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from configs.rank_plan import make_rank_plan
from configs.schema import ModelSection, TrainerSection
from envs.base import EnvSpec
from envs.spaces import ActionSpace
from learner.update.batch import TEAM_FIELDS, RowBatch
from learner.ranks.distributed import CollectiveTimeout, init_learner_group
from learner.ppo.update import ppo_update
from learner.update.reducer import SINGLE_PROCESS, Reducer
from learner.ppo.schedules import UpdateSchedule
from learner.ppo.value_normalization import RunningMeanStd
from policies.factory import make_policy
from tests.distributed_coma_case import run_coma_steps

TIMEOUT_EXIT = 3
"""Exit status of a rank whose collective timed out."""
STALL_SECONDS = 120.0
"""How long a ``--stall`` rank sleeps (the test kills it long before)."""
OBS, HORIZON = 4, 4
SPEC = EnvSpec(num_agents=1, obs_shape=(OBS,), obs_dtype="float32", action=ActionSpace.discrete(3))
PER_STEP = ("logprobs", "values", "rewards", "dones", "bootstrap")


def make_case(rows: int, seed: int) -> dict[str, torch.Tensor]:
    """A synthetic batch of ``rows`` rows of HORIZON + 1 steps (the RowBatch fields a per-agent PPO batch fills)."""
    rng = np.random.default_rng(seed)
    dones = (rng.random((rows, HORIZON + 1)) < 0.2).astype(np.float32)
    arrays = {"obs": rng.normal(size=(rows, HORIZON + 1, OBS)).astype(np.float32),
              "actions": rng.integers(0, 3, size=(rows, HORIZON + 1)).astype(np.int64),
              "logprobs": np.log(rng.uniform(0.2, 0.5, size=(rows, HORIZON + 1))).astype(np.float32),
              "values": rng.normal(size=(rows, HORIZON + 1)).astype(np.float32),
              "rewards": rng.normal(size=(rows, HORIZON + 1)).astype(np.float32),
              "dones": dones,
              "bootstrap": (rng.normal(size=dones.shape) * dones * (rng.random(dones.shape) < 0.5)).astype(np.float32)}
    return {name: torch.from_numpy(array) for name, array in arrays.items()}


def row_batch(case: dict[str, torch.Tensor], rows: slice) -> RowBatch:
    """The RowBatch of ``rows`` of the case."""
    count = case["obs"][rows].shape[0]
    return RowBatch(obs=case["obs"][rows], actions=case["actions"][rows],
                    action_masks=torch.zeros((count, HORIZON + 1, 0), dtype=torch.uint8),
                    states=torch.zeros((count, 0)), versions=torch.zeros(count, dtype=torch.int64),
                    **{name: case[name][rows] for name in PER_STEP},
                    **{name: torch.zeros((count, HORIZON + 1, 0)) for name in TEAM_FIELDS})


def build_learner(seed: int) -> tuple[nn.Module, torch.optim.Optimizer, RunningMeanStd]:
    """The policy, its Adam optimizer and the value-target normaliser, identical for the same seed."""
    torch.manual_seed(seed)
    policy = make_policy(SPEC, ModelSection(hidden_size=16, num_layers=1))
    return policy, torch.optim.Adam(policy.parameters(), lr=1e-2, eps=1e-8), RunningMeanStd()


def run_update(case: dict[str, torch.Tensor], trainer: TrainerSection, *, rank: int, world_size: int,
               reducer: Reducer = SINGLE_PROCESS, seed: int = 0) -> tuple[nn.Module, RunningMeanStd, dict]:
    """One update of rank ``rank``'s contiguous share of the case's rows; returns the policy, normaliser, metrics."""
    plan = make_rank_plan(trainer, num_agents=1, world_size=world_size).rank
    policy, optimizer, value_normalizer = build_learner(seed)
    share = slice(rank * plan.segments, (rank + 1) * plan.segments)
    schedule = UpdateSchedule(learning_rate=1e-2, ent_coef=trainer.ent_coef, clip_coef=trainer.clip_coef,
                              anneal_beta=0.6, kl_coef=0.0, vf_warmup=False)
    metrics = ppo_update(policy, optimizer, row_batch(case, share), trainer=trainer, plan=plan, schedule=schedule,
                         generator=torch.Generator().manual_seed(seed + rank), reducer=reducer,
                         value_normalizer=value_normalizer if trainer.norm_value_targets else None)
    return policy, value_normalizer, metrics


def main(argv: list[str]) -> int:
    """Run one rank; the exit status is 0, or TIMEOUT_EXIT after a collective timeout."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--init-method", required=True)
    parser.add_argument("--directory", type=Path, required=True)
    parser.add_argument("--timeout-s", type=float, required=True)
    parser.add_argument("--stall", action="store_true")
    parser.add_argument("--coma", action="store_true", help="the COMA case (tests/distributed_coma_case.py)")
    args = parser.parse_args(argv)
    timeout = datetime.timedelta(seconds=args.timeout_s)
    try:
        reducer = init_learner_group(torch.device("cpu"), timeout=timeout, init_method=args.init_method,
                                     rank=args.rank, world_size=args.world_size)
        if args.stall:
            time.sleep(STALL_SECONDS)
            return 0
        if args.coma:
            coma, steps = run_coma_steps(load_file(str(args.directory / "coma.safetensors")), rank=args.rank,
                                         world_size=args.world_size, reducer=reducer)
            save_file({k: v.contiguous() for k, v in coma.state_dict().items()},
                      str(args.directory / f"coma{args.rank}.safetensors"))
            (args.directory / f"coma{args.rank}.json").write_text(json.dumps(steps))
            leave_without_teardown()
        case = load_file(str(args.directory / "batch.safetensors"))
        trainer = TrainerSection(**json.loads((args.directory / "trainer.json").read_text()))
        policy, value_normalizer, metrics = run_update(case, trainer, rank=args.rank, world_size=args.world_size,
                                                       reducer=reducer)
    except CollectiveTimeout as error:
        print(f"CollectiveTimeout: {error}", file=sys.stderr, flush=True)
        os._exit(TIMEOUT_EXIT)  # the group's pending work would abort a normal interpreter exit (SIGABRT)
    save_file({**{f"policy.{k}": v.contiguous() for k, v in policy.state_dict().items()},
               **{f"value_normalizer.{k}": v for k, v in value_normalizer.state_dict().items()}},
              str(args.directory / f"rank{args.rank}.safetensors"))
    (args.directory / f"rank{args.rank}.json").write_text(json.dumps(metrics))
    leave_without_teardown()
    return 0


def leave_without_teardown() -> None:
    """Meet the other ranks, then exit at once: a normal exit (or destroy_process_group) once aborted in gloo's
    teardown ("terminate called without an active exception", SIGABRT) after every output was written, as the
    learner_update bench's ranks did; every rank has written its files when the barrier returns."""
    torch.distributed.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
