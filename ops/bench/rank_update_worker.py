"""One learner rank of ``python -m ops.bench.learner_update --ranks K`` (K > 1), run as a real process by its
launcher, from the repository root: ``python -m ops.bench.rank_update_worker --rank R --world-size K --init-method
file://... --timeout-s T --threads N --config C --encoder E --updates U [--set key=value ...]``.

It takes N torch threads, joins the gloo group, builds the policy every rank builds (same seed) and its own synthetic
share of the batch (seeded by rank), and times the data-parallel ``ppo_update`` (``learner_update.time_updates``).
Rank 0 prints the record as one JSON line. Every rank ends through ``os._exit`` after a barrier: 0, or TIMEOUT_EXIT
after a collective timeout.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
from dataclasses import replace

import torch
import torch.distributed as dist

from configs.loader import load_config
from learner.ranks.distributed import CollectiveTimeout, init_learner_group
from ops.bench.learner_update import time_updates, with_ranks

TIMEOUT_EXIT = 3
"""Exit status of a rank whose collective (or the rendezvous) timed out."""


def main(argv: list[str]) -> int:
    """Time one rank's updates; the exit status is 0, or TIMEOUT_EXIT after a collective timeout."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--world-size", type=int, required=True)
    parser.add_argument("--init-method", required=True)
    parser.add_argument("--timeout-s", type=float, required=True)
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--encoder", required=True)
    parser.add_argument("--updates", type=int, required=True)
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = load_config(args.config, args.overrides)
    config = replace(config, model=replace(config.model, encoder=args.encoder))
    device = torch.device("cpu")
    try:
        reducer = init_learner_group(device, timeout=datetime.timedelta(seconds=args.timeout_s),
                                     init_method=args.init_method, rank=args.rank, world_size=args.world_size)
        record = time_updates(config, device, args.updates, compiled=False, reducer=reducer, rank=args.rank)
    except CollectiveTimeout as error:
        print(f"CollectiveTimeout: {error}", file=sys.stderr, flush=True)
        os._exit(TIMEOUT_EXIT)  # the group's pending work would abort a normal interpreter exit (SIGABRT)
    if args.rank == 0:
        print(json.dumps(with_ranks(record, ranks=args.world_size)), flush=True)
    # Every rank reaches this point before any leaves, then ends without running the group's C++ destructors: once in
    # a CI run a rank whose peer had already torn the group down aborted at exit (SIGABRT, "terminate called without an
    # active exception", a gloo thread still joinable), which failed the bench although its figures were printed.
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
