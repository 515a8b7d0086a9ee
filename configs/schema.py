"""Typed run configuration: one frozen dataclass per YAML section, one docstring line per field.

Field docstrings are the documentation of the YAML keys. ``configs/defaults.yaml`` carries the seed values;
``configs.loader`` turns YAML plus ``--set`` overrides into a validated ``RunConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal, get_args

from configs.env_config import ENV_NAMES, EnvConfig  # noqa: F401 (ENV_NAMES: still importable from here)
from configs.field_rules import (Fraction, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveFraction,
                                 PositiveInt, Range)

# The strings a key allows: a Literal type on the field, and the same values as a tuple for the modules that check
# or list them (argparse choices, envs.registry, policies.encoders).
Device = Literal["auto", "cpu", "cuda"]
Schedule = Literal["constant", "cosine", "linear", "logarithmic"]
Optimizer = Literal["adam", "adamw"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune"]
AutocastMode = Literal["none", "bf16"]
ModelCore = Literal["mlp", "lstm"]
ModelEncoder = Literal["auto", "mlp", "cnn", "tokens"]
Algorithm = Literal["ppo", "coma"]
ComaDefaultAction = Literal["zero", "mean", "sampled"]

DEVICES: tuple[str, ...] = get_args(Device)
SCHEDULES: tuple[str, ...] = get_args(Schedule)
OPTIMIZERS: tuple[str, ...] = get_args(Optimizer)
COMPILE_MODES: tuple[str, ...] = get_args(CompileMode)
AUTOCAST_MODES: tuple[str, ...] = get_args(AutocastMode)
MODEL_CORES: tuple[str, ...] = get_args(ModelCore)
MODEL_ENCODERS: tuple[str, ...] = get_args(ModelEncoder)
ALGORITHMS: tuple[str, ...] = get_args(Algorithm)
COMA_DEFAULT_ACTIONS: tuple[str, ...] = get_args(ComaDefaultAction)


@dataclass(frozen=True, kw_only=True)
class RunSection:
    """Where the run lives and what it runs on."""

    name: str = "run"
    """Run name; the default run directory is runs/<name>-<timestamp>."""
    device: Device = "auto"
    """Learner device: auto (cuda when available), cpu or cuda."""
    seed: int = 1
    """Seed for the learner's model init and sampling; actor hosts derive theirs from it."""
    checkpoint_interval: PositiveInt = 50
    """Write a checkpoint every this many updates (and always at the end)."""
    keep_checkpoints: PositiveInt = 3
    """How many most recent checkpoints to keep."""
    torch_threads: PositiveInt = 1
    """torch intra-op threads, and BLAS threads under NumPy's products, in the learner and in actor inference; keep
    threads x processes within the cores (oversubscribed, every small op waits on spinning threads: 2 on a 2-core
    COMA run made updates 3.7x slower)."""
    stall_factor: Annotated[float, Range(low=1.0)] = 10.0
    """With actor hosts registered, no update for this many times the usual interval between updates is a stall:
    one line naming the likely cause, the sluice_learner_stalled gauge (learner/monitor/stall_watch.py)."""
    stall_min_s: PositiveFloat = 60.0
    """Never a stall before this many seconds without an update (before the first update: 5 times this, from the
    first host's arrival)."""
    wandb: bool = False
    """Also log each update's scalars (those TensorBoard gets), the resolved config and the final checkpoint to
    Weights & Biases, offline (files in <tracking_dir>/wandb/; WANDB_MODE set in the environment wins): needs the
    tracking extra (learner/monitor/tracking.py)."""
    mlflow: bool = False
    """Also log them to MLflow (mlflow_tracking_uri; default a file store in <tracking_dir>/mlruns): needs the
    tracking extra."""
    tracking_dir: str = ""
    """Where W&B's offline files and MLflow's file store go; empty: the run directory (a relative path is taken
    from the directory the learner starts in)."""
    wandb_project: str = "sluice"
    """W&B project of the run, not empty (the run's name is its directory's)."""
    mlflow_experiment: str = "sluice"
    """MLflow experiment the run is logged under, not empty (made if missing)."""
    mlflow_tracking_uri: str = ""
    """MLflow tracking URI (file:..., sqlite:///..., http://...); empty: file:<tracking_dir>/mlruns."""


@dataclass(frozen=True, kw_only=True)
class TrainerSection:
    """PPO and batch settings; names and default values follow seeds/000."""

    algorithm: Algorithm = "ppo"
    """Learning algorithm: ppo (seeds/000) or coma (seeds/004; its settings are the coma section)."""
    num_workers: PositiveInt = 16
    """Env worker processes per actor host (python -m actors --n overrides it on that host)."""
    batch_size: PositiveInt = 524288
    """Agent transitions per update: segments * bptt_horizon (one row holds one agent's steps)."""
    minibatch_size: PositiveInt = 16384
    """Agent transitions per gradient step."""
    bptt_horizon: PositiveInt = 64
    """Transitions per row (rows store bptt_horizon + 1 steps; the last is shared with the next row)."""
    update_epochs: PositiveInt = 1
    """Passes over the batch per update."""
    forward_pass_minibatch_target_size: PositiveInt = 4096
    """Target agents per inference forward pass on an actor host."""
    async_factor: PositiveInt = 2
    """Env batches in flight per worker (2 = double buffering)."""
    total_timesteps: PositiveInt = 10_000_000_000
    """Stop after this many agent steps (env steps x active agents; the unit batch_size counts)."""
    gamma: PositiveFraction = 0.977
    """Discount factor."""
    gae_lambda: Fraction = 0.916
    """GAE lambda."""
    clip_coef: PositiveFloat = 0.1
    """PPO policy ratio clip."""
    ent_coef: NonNegativeFloat = 0.0021
    """Entropy bonus coefficient."""
    vf_coef: NonNegativeFloat = 0.44
    """Value loss coefficient."""
    vf_clip_coef: PositiveFloat = 0.1
    """Value clip around the behaviour value (used when clip_vloss)."""
    clip_vloss: bool = True
    """Use the clipped value loss."""
    norm_adv: bool = True
    """Normalise advantages per minibatch."""
    max_grad_norm: PositiveFloat = 0.5
    """Global gradient norm clip."""
    prio_alpha: NonNegativeFloat = 0.0
    """Prioritized row sampling strength (0 = uniform)."""
    prio_beta0: Fraction = 0.6
    """Initial importance-sampling exponent."""
    vtrace_rho_clip: PositiveFloat = 1.0
    """V-trace rho clip on the TD error."""
    vtrace_c_clip: PositiveFloat = 1.0
    """V-trace c clip on the trace."""
    learning_rate: PositiveFloat = 0.000457
    """Initial learning rate."""
    min_learning_rate: NonNegativeFloat = 0.00003
    """Final learning rate of a decaying schedule."""
    lr_schedule: Schedule = "cosine"
    """Learning-rate schedule: constant, cosine, linear (seeds/003 annealing) or logarithmic."""
    ent_coef_schedule: Schedule = "linear"
    """Entropy-coefficient schedule (from ent_coef to min_ent_coef): constant, cosine, linear or logarithmic."""
    min_ent_coef: NonNegativeFloat = 0.0
    """Final entropy coefficient of a decaying schedule."""
    clip_coef_schedule: Schedule = "logarithmic"
    """PPO-clip schedule (from clip_coef to min_clip_coef): constant, cosine, linear or logarithmic."""
    min_clip_coef: PositiveFloat = 0.05
    """Final (floor) clip coefficient of a decaying schedule."""
    log_schedule_decay: NonNegativeFloat = 0.1
    """Decay rate of every logarithmic schedule: max(min, initial * exp(-decay * progress))."""
    optimizer: Optimizer = "adam"
    """Optimizer: adam or adamw (decoupled weight decay, seeds/003)."""
    adam_eps: PositiveFloat = 1e-8
    """Adam epsilon."""
    weight_decay: NonNegativeFloat = 0.0
    """Weight decay: decoupled with adamw, an L2 term with adam."""
    gradient_accumulation: PositiveInt = 1
    """Minibatches whose gradients are averaged before one optimizer step (must divide num_minibatches)."""
    kl_divergence_coef_rho: NonNegativeFloat = 0.0
    """Coefficient of the KL(pi || pi_ref) penalty to a reference policy (0 = off; seeds/003)."""
    coef_rho_decay: Fraction = 1.0
    """The KL coefficient is multiplied by this after every update."""
    enable_ref_update: bool = False
    """Refresh the reference policy from the current one every ref_update_interval updates."""
    ref_update_interval: PositiveInt = 100
    """Updates between reference refreshes (when enable_ref_update)."""
    vf_warmup: NonNegativeInt = 0
    """First updates that optimise only the value loss (plus the KL penalty if on)."""
    zero_initial_vf: bool = False
    """Initialise the value head's weights and bias to zero."""
    target_kl: PositiveFloat | None = None
    """KL early stopping (CleanRL): once the mean approx_kl of the current epoch's minibatches exceeds this, the
    update's remaining minibatches and epochs are skipped (null = off)."""
    norm_value_targets: bool = False
    """The value head predicts returns normalised by their running mean and std (kept in checkpoints); the value
    loss, clipping included, is computed in that space (learner/ppo/value_normalization.py)."""
    entropy_floor: PositiveFloat | None = None
    """Adaptive entropy: below this mean entropy the next update's ent_coef is raised (x1.5, at most 10x the
    scheduled value), above it relaxed back toward the schedule (null = off; learner/ppo/entropy_control.py)."""
    compile: bool = False
    """torch.compile the learner's policy forward and loss."""
    compile_mode: CompileMode = "default"
    """torch.compile mode: default, reduce-overhead or max-autotune."""
    autocast: AutocastMode = "none"
    """Mixed precision of PPO's update: none (float32) or bf16 (forward passes and losses under torch.autocast in
    bfloat16; the weights, their gradients and the optimizer stay float32). trainer.algorithm coma needs none."""
    max_policy_lag: NonNegativeInt = 8
    """Rows whose behaviour policy is more than this many versions old are dropped and counted."""
    target_episode_return: float | None = None
    """Stop successfully once the mean return of the last 100 episodes reaches this (null = never)."""


@dataclass(frozen=True, kw_only=True)
class ModelSection:
    """Policy network shape (the same module runs on actors and learner)."""

    hidden_size: PositiveInt = 64
    """Width of each hidden layer."""
    num_layers: PositiveInt = 2
    """Hidden layers of the MLP torso."""
    core: ModelCore = "mlp"
    """Policy core: mlp (feed-forward) or lstm (an LSTM after the torso, trained by BPTT over rows)."""
    shared_torso: bool = False
    """One torso for both heads (true) or a separate critic torso (false: value targets cannot swamp the policy)."""
    encoder: ModelEncoder = "auto"
    """Observation encoder before the torso: auto (tokens for an env spec with a token layout, cnn for one that
    declares an image layout, EnvSpec.image_layout, with H, W >= 3, one encoder per leaf for a structured Dict / Tuple
    observation, policies/leaf_encoder.py, else mlp), mlp (flatten), cnn (3x3 convolutions) or tokens (embedded
    sparse entries, masked mean pooling)."""
    cnn_channels: list[PositiveInt] = field(default_factory=lambda: [16, 16])
    """Output channels of the cnn encoder's 3x3 conv layers (ReLU); a linear layer to hidden_size follows (16, 16:
    a gridworld update costs about 1.6x the mlp's on 2 CPU cores, 32, 32 about 4x; ops/bench/learner_update.py)."""
    obs_norm: bool = False
    """Running observation normalisation: clip((obs - mean) / std, -5, 5) per feature (mlp) or channel (cnn), the
    statistics updated by the learner from each update's rows, carried with the weights and the checkpoint, frozen
    at evaluation (policies/obs_normalization.py); not for the tokens encoder; on a structured observation, for
    its Box leaves that are not token lists."""


@dataclass(frozen=True, kw_only=True)
class NetworkSection:
    """Sockets, liveness and back-pressure."""

    host: str = "127.0.0.1"
    """Address the learner binds."""
    port: Annotated[int, Range(low=1, high=65532)] = 5555
    """Control port (request-reply); data and weights use port + 1 and port + 2 (and /metrics port + 3 by default)."""
    heartbeat_interval_s: PositiveFloat = 1.0
    """Seconds between heartbeats in each direction."""
    peer_timeout_s: PositiveFloat = 10.0
    """A peer silent for this long is considered gone."""
    rows_per_message: PositiveInt = 64
    """Rows per ROWS message from an actor host, at least: small rows travel more to a message (message_bytes)."""
    message_bytes: Annotated[int, Range(low=0)] = 1 << 20
    """Small rows travel as many to a message as fit in this many bytes (and in half of max_message_bytes), up to one
    batch's segments and half of send_queue_messages x rows_per_message (0: always rows_per_message); hosts and
    learner derive the same count (envs.rows.message_sizing)."""
    send_queue_messages: PositiveInt = 8
    """ZeroMQ high-water mark on the data sockets, in messages of rows_per_message rows: the bound on rows in
    flight (fewer, bigger messages when message_bytes makes them bigger)."""
    socket_buffer_bytes: Annotated[int, Range(low=4096)] = 262144
    """Kernel send/receive buffer of the data sockets; bounds what hides in TCP below the high-water mark."""
    same_machine_ipc: bool = True
    """Actor hosts on the learner's machine (same boot and network namespace) send rows over ipc:// instead of TCP."""
    shared_memory_rows: bool = True
    """With same_machine_ipc, those hosts leave each message's rows in a shared-memory slot the learner reads them
    from, and send only where they lie (protocol/shared_rows.py), when a message holds shared_rows_min_bytes."""
    shared_rows_min_bytes: Annotated[int, Range(low=0)] = 0
    """Smallest full message whose rows go through shared memory (0: all; ops.bench.pipeline --transport shm against
    ipc measured CartPole's 20 kB messages as fast and the gridworld's 3 MB ones faster that way)."""
    max_message_bytes: Annotated[int, Range(low=1024)] = 1 << 28
    """Largest message accepted on any socket."""
    max_abs_value: PositiveFloat = 1e6
    """Largest magnitude the learner accepts in a ROWS message's float observations, actions, log-probs, values,
    rewards, bootstraps and recurrent states (and an episode return, per step of its length); more is absurd and
    the message is dropped (reason absurd_value)."""
    curve_secret_key: str = ""
    """CURVE: the learner's server.key_secret file (python -m protocol.keys); empty: no encryption."""
    curve_allowed_clients: str = ""
    """CURVE: directory of the actor hosts' public .key files allowed to connect (with curve_secret_key)."""
    metrics_host: str = "127.0.0.1"
    """Address the learner's Prometheus endpoint (/metrics, /discovery/actor_hosts) binds; plain HTTP, so loopback
    unless set wider on purpose."""
    metrics_port: Annotated[int, Range(low=0, high=65535)] | None = None
    """Its port; None: port + 3 (next to the data and weights ports); 0: a free port (printed at start)."""


@dataclass(frozen=True, kw_only=True)
class SelfPlaySection:
    """Self-play against an opponent pool of the learner's past snapshots (seeds/002; names follow the seed)."""

    enabled: bool = False
    """Play every env against pool snapshots; only the learner's seats produce training rows."""
    per_env_opponent_sampling: bool = True
    """Each env draws its own opponent (true) or all envs of a host share one draw (false)."""
    opponent_pool_size: PositiveInt = 10
    """K: the geometric draw is over the newest K snapshots."""
    opponent_pool_beta: PositiveFraction = 0.7
    """beta in (0, 1]: P(age k) proportional to beta**k, age 0 = newest; SMALLER beta = more weight on the newest."""
    opponent_pool_exploration: Fraction = 0.15
    """eps in [0, 1]: chance of a uniform draw from all snapshots (once there are more than K)."""
    snapshot_interval: PositiveInt = 10
    """Add the learner's current weights to the pool every this many updates (and once at the start)."""
    alternation_steps: PositiveInt = 50_000
    """Env steps per env between redraws; an env switches to its new opponent at its next episode end."""
    cache_size: PositiveInt = 16
    """Snapshots an actor host keeps loaded beyond those in use (least recently used dropped first)."""
    baseline_opponents: dict[str, float] = field(default_factory=dict)
    """Fixed baselines mixed into each env's draw, name -> chance (e.g. {one_ply: 0.2}; names as configs.baselines:
    random, one_ply, negamax-<depth> or an entry point module.path:callable); the rest from the pool."""


@dataclass(frozen=True, kw_only=True)
class EvaluationSection:
    """Evaluation during training: pool snapshots against fixed baselines, the best one kept (two-player envs)."""

    interval_updates: NonNegativeInt = 0
    """Evaluate the first pool snapshot at least this many updates after the last evaluated one; 0 = off."""
    games: Annotated[int, Range(low=2)] = 100
    """Games per baseline and evaluation (even: each seat played equally often)."""
    baselines: list[str] = field(default_factory=lambda: ["one_ply", "negamax-2"])
    """Baselines played: random, one_ply, negamax-<depth> (those two on connect_four) or an entry point
    module.path:callable returning a player; the best snapshot has the highest mean score over them."""
    greedy: bool = False
    """Snapshots take their most probable legal action (true) or sample as in training (false)."""
    gate_games: NonNegativeInt = 0
    """> 0: a snapshot that scores at least the best's must also score significantly > 0.5 (0.5 + 2 standard errors)
    in this many games (even) against it, and against the earlier kept bests (this many games each) a mean at most 2
    standard errors below its mean in the same games; both sides sample their moves."""


@dataclass(frozen=True, kw_only=True)
class ComaSection:
    """COMA for cooperative continuous control (seeds/004; names and default values follow the seed)."""

    actor_lr: PositiveFloat = 3e-4
    """Adam learning rate of the actors."""
    critic_lr: PositiveFloat = 3e-4
    """Adam learning rate of the centralised critic."""
    gamma: PositiveFraction = 0.99
    """Discount factor of the critic's TD target."""
    tau: PositiveFraction = 0.005
    """Soft target update rate in (0, 1]: theta' <- tau * theta + (1 - tau) * theta' (1 = hard copy)."""
    batch_size: PositiveInt = 64
    """Transitions per gradient step, sampled uniformly from the replay buffer."""
    epochs: PositiveInt = 10
    """Gradient steps (critic, then actors, then target updates) per rollout."""
    rollout_length: PositiveInt = 2000
    """Env steps collected between updates."""
    buffer_size: PositiveInt = 100_000
    """Replay buffer capacity in transitions (the oldest are overwritten)."""
    max_grad_norm: PositiveFloat = 0.5
    """Gradient norm clip, applied to the critic and to each actor."""
    entropy_coef: NonNegativeFloat = 0.0
    """Weight of the entropy bonus in the actor loss (0 = off; the pre-squash Gaussian entropy)."""
    hidden_sizes: list[PositiveInt] = field(default_factory=lambda: [256, 256])
    """Hidden layer widths (ReLU) of the actors and of the critic."""
    parameter_sharing: bool = False
    """One actor per agent (false, the seed's design) or one shared actor fed a one-hot agent id (true)."""
    default_action: ComaDefaultAction = "zero"
    """Agent i's action in the counterfactual baseline: zero (the env's no-op; default because the seed specifies it
    and it is the cheapest, one extra critic row per agent), mean (the agent's own mean action) or sampled (Monte
    Carlo over the agent's policy, the original COMA baseline; counterfactual_samples rows per agent). None depends
    on agent i's taken action, so all keep the policy gradient unbiased; they differ in variance and cost."""
    counterfactual_samples: PositiveInt = 8
    """Draws per agent and transition for default_action: sampled."""
    max_importance_weight: PositiveFloat = 1.0
    """c: the actor loss weighs a replayed action by min(pi/mu, c) (exactly the seed's gradient on fresh data;
    bounded on stale replay, where the unweighted loss diverges); learner/coma/algorithm.py says why."""
    max_importance_weight_negative: PositiveFloat = 3.0
    """c_neg >= c: the cap for actions whose advantage is negative, min(pi/mu, c_neg) (dual-clip PPO's second clip, and
    its value 3): above c the policy still learns to leave a bad action it has come to prefer (= c: one cap)."""


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """A whole run: every section."""

    run: RunSection = field(default_factory=RunSection)
    """Run directory, device, seeding, checkpoints."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """The environment."""
    trainer: TrainerSection = field(default_factory=TrainerSection)
    """PPO and batch settings."""
    model: ModelSection = field(default_factory=ModelSection)
    """Policy network."""
    network: NetworkSection = field(default_factory=NetworkSection)
    """Sockets and liveness."""
    selfplay: SelfPlaySection = field(default_factory=SelfPlaySection)
    """Self-play against the opponent pool."""
    coma: ComaSection = field(default_factory=ComaSection)
    """COMA settings (used when trainer.algorithm is coma)."""
    evaluation: EvaluationSection = field(default_factory=EvaluationSection)
    """Evaluation of pool snapshots against baselines during training."""


SECTIONS: dict[str, type] = {
    "run": RunSection,
    "env": EnvConfig,
    "trainer": TrainerSection,
    "model": ModelSection,
    "network": NetworkSection,
    "selfplay": SelfPlaySection,
    "coma": ComaSection,
    "evaluation": EvaluationSection,
}
