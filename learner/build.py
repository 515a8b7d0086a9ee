"""The learner's choices that the ranks of a data-parallel learner share: the device, the algorithm and the batch
plan one learner process trains (learner/trainer.py and learner/follower.py both take them from here)."""

from __future__ import annotations

import torch

from configs.loader import ConfigError
from configs.plan import BatchPlan, make_plan
from configs.rank_plan import make_rank_plan
from configs.schema import RunConfig
from envs.base import EnvSpec
from envs.errors import EnvConfigError
from learner.update.algorithm import Algorithm
from learner.coma.learner import ComaLearner
from learner.ppo.algorithm import PPO
from learner.ranks.context import RankContext
from learner.update.reducer import SINGLE_PROCESS, Reducer


def resolve_device(name: str) -> torch.device:
    """auto -> cuda when available, else cpu; cuda without a GPU is a ConfigError."""
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("run.device is 'cuda' but torch sees no CUDA device; use 'auto' or 'cpu'")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def make_algorithm(config: RunConfig, spec: EnvSpec, plan: BatchPlan, *, device: torch.device,
                   seed: int, reducer: Reducer = SINGLE_PROCESS) -> Algorithm:
    """trainer.algorithm's learner: PPO (seeds/000) or COMA (seeds/004, which needs Box actions and a global state:
    ConfigError otherwise). ``seed``: run.seed + the update the run starts at; ``reducer`` and ``plan``: a
    data-parallel learner rank's collectives and share of the batch."""
    if config.trainer.algorithm == "coma":
        try:
            return ComaLearner(spec=spec, section=config.coma, device=device, seed=seed, reducer=reducer)
        except EnvConfigError as err:
            raise ConfigError(f"env {config.env.name!r}: {err}") from err
    return PPO(spec=spec, model=config.model, trainer=config.trainer, plan=plan, device=device, minibatch_seed=seed,
               reducer=reducer)


def learner_plan(config: RunConfig, ranks: RankContext | None) -> BatchPlan:
    """The batch plan one learner process trains: the run's, or a rank's share of it (PlanError with the numbers
    when the batch does not split over the ranks)."""
    if ranks is None:
        return make_plan(config.trainer, num_agents=config.env.num_agents)
    return make_rank_plan(config.trainer, num_agents=config.env.num_agents, world_size=ranks.world_size,
                          coma=config.coma).rank
