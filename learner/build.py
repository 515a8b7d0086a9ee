"""What one learner process trains with, built the same way by rank 0 (learner/trainer.py) and the other ranks of a
data-parallel learner (learner/follower.py): the device, the env's spec, the batch plan and the algorithm."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from configs.loader import ConfigError
from configs.plan import BatchPlan, make_plan
from configs.rank_plan import make_rank_plan
from configs.schema import RunConfig
from envs.base import EnvSpec
from envs.errors import EnvConfigError
from envs.registry import probe_env_spec
from learner.update.algorithm import Algorithm
from learner.coma.learner import ComaLearner
from learner.ppo.algorithm import PPO
from learner.ranks.context import RankContext
from learner.run.checkpoint import Checkpoint
from learner.update.reducer import SINGLE_PROCESS, Reducer
from policies.threads import use_threads


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


@dataclass(frozen=True, kw_only=True)
class LearnerSetup:
    """What one learner process trains with, built the same way on every rank."""

    device: torch.device
    """Where the updates run (run.device resolved)."""
    spec: EnvSpec
    """The env's spaces, agents and episode statistics (probed without stepping it)."""
    plan: BatchPlan
    """The batch this process fills and trains: the run's, or a rank's share."""
    checkpoint: Checkpoint | None
    """The checkpoint the run continues from (None: a fresh run)."""
    algorithm: Algorithm
    """PPO or COMA, the checkpoint's weights loaded."""


def build_learner(config: RunConfig, ranks: RankContext | None, *, resume: Callable[[], Checkpoint | None],
                  seed_offset: int = 0) -> LearnerSetup:
    """Threads, seed, device, env spec and plan (a config mistake stops here, before any file is touched), then the
    checkpoint ``resume`` returns (None: fresh weights) and the algorithm, seeded with run.seed + the update the run
    starts at + ``seed_offset`` (a rank's). Under torchrun every rank then holds rank 0's weights (a broadcast)."""
    use_threads(config.run.torch_threads)
    torch.manual_seed(config.run.seed)
    device = resolve_device(config.run.device)
    spec = probe_env_spec(config.env, note=lambda line: print(f"learner: {line}", flush=True))
    plan = learner_plan(config, ranks)
    checkpoint = resume()
    update = 0 if checkpoint is None else checkpoint.trainer_state.update
    algorithm = make_algorithm(config, spec, plan, device=device, seed=config.run.seed + update + seed_offset,
                               reducer=SINGLE_PROCESS if ranks is None else ranks.reducer)
    if checkpoint is not None:
        algorithm.load_state_dict(checkpoint.learned)
    if ranks is not None:
        ranks.reducer.broadcast_module(algorithm.replicated())
    return LearnerSetup(device=device, spec=spec, plan=plan, checkpoint=checkpoint, algorithm=algorithm)
