"""`python -m evaluation.evaluate`: run a trained agent on its run's env and report its mean return.

    python -m evaluation.evaluate --run-dir runs/cartpole-... --episodes 100 [--checkpoint N] [--deterministic]
                               [--opponent SPEC] [--video out.mp4 [--fps F]] [--seed S]

Loads ``config.yaml`` and a checkpoint's ``model.safetensors`` (the newest unless ``--checkpoint N`` names an
update), plays ``--episodes`` agent episodes in this process (``evaluation.episode_runner``) and prints the mean
return with a 95% confidence interval (mean +- 1.96 * std / sqrt(n)), the episode count and the mean length.

On a two-player turn-based env (``connect_four``, a two-agent ``pettingzoo_aec``) the policy plays ``--episodes`` games against an opponent
(``evaluation.opponents``: a baseline, a snapshot of the run's pool, an entry point ``module:callable`` called as
``fn(seed=<--seed>)``, or ``self``), batched by ``evaluation.arena.play_match`` with seats alternating, and the output adds one line of win,
draw and loss rates, overall and per seat. Without ``--opponent`` the opponent is the ``random`` baseline, and a
one-line note on stderr says so; ``--opponent self`` is the old self-play (both seats the policy, every seat's
episode counted).

``--video`` writes env 0's episodes as an mp4 (imageio's ffmpeg plugin) at ``--fps`` frames per second
(default 30): the built-in cartpole, gridworld and connect_four are drawn by ``evaluation.frames``, a Gymnasium or
PettingZoo env by its own ``render()`` (made with render_mode='rgb_array'). Usage and input problems print one line
``python -m evaluation.evaluate: error: <message>`` on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from configs.baselines import TWO_PLAYER_ENVS
from envs.base import StepBuffers, VecEnv
from envs.errors import EnvConfigError
from evaluation.arena import MatchObserver, MatchOutcome, PolicyPlayer, play_match
from evaluation.episode_runner import EpisodeResults, run_episodes
from evaluation.frames import SELF_RENDERING_ENVS, frame_drawer
from evaluation.load_policy import LoadedPolicy, LoadPolicyError, load_policy
from evaluation.opponents import SELF, Opponent, OpponentError, resolve_opponent
from policies.factory import state_arrays

PROG = "python -m evaluation.evaluate"
VIDEO_FPS = 30
"""Frames per second of ``--video`` when ``--fps`` is not given."""
Note = Callable[[str], None]
"""Told (one line) when the opponent is the default one."""
DEFAULT_OPPONENT = "random"
"""The opponent on a two-player env when ``--opponent`` is not given."""


class EvaluateError(ValueError):
    """A usage or input problem: reported as ``python -m evaluation.evaluate: error: <message>``, exit status 2."""


@dataclass(frozen=True, kw_only=True)
class MatchReport:
    """The policy's games against an opponent on a two-player env, from the policy's side."""

    opponent: str
    """The opponent's name (``evaluation.opponents.Opponent.name``)."""
    outcome: MatchOutcome
    """What ``evaluation.arena.play_match`` returned (the policy is player a)."""


@dataclass(frozen=True, kw_only=True)
class ReturnSummary:
    """Mean return of a set of episodes with its 95% confidence interval."""

    mean: float
    """Mean undiscounted return."""
    half_width: float
    """1.96 * std / sqrt(episodes) (population std; 0 for one episode)."""
    episodes: int
    """Episodes summarised."""
    mean_length: float
    """Mean episode length in steps."""
    match: MatchReport | None = None
    """The games against an opponent (None when the policy played alone or against itself)."""


def summarise(results: EpisodeResults) -> ReturnSummary:
    """Mean, 95% confidence half-width, count and mean length of ``results``."""
    n = len(results.returns)
    return ReturnSummary(mean=float(results.returns.mean()),
                         half_width=1.96 * float(results.returns.std()) / math.sqrt(n),
                         episodes=n, mean_length=float(results.lengths.mean()))


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = argparse.ArgumentParser(prog=prog, description="Run a trained agent and report its mean return "
                                     "with a 95% confidence interval (and, on a two-player env, its win, draw and "
                                     "loss rates against an opponent).")
    parser.add_argument("--run-dir", type=Path, required=True, help="run directory (holds config.yaml, checkpoints/)")
    parser.add_argument("--checkpoint", type=int, default=None,
                        help="update number of the checkpoint to load (default: the newest)")
    parser.add_argument("--episodes", type=int, default=100,
                        help="agent episodes to play (default 100; every agent of a multi-agent env counts; on a "
                             "two-player env, games against --opponent)")
    parser.add_argument("--deterministic", action="store_true",
                        help="take the most probable legal action (the mean for box) instead of sampling (a pool "
                             "snapshot --opponent too)")
    parser.add_argument("--opponent", default=None, metavar="SPEC",
                        help="two-player envs (connect_four, pettingzoo_aec): who the policy plays, seats "
                             "alternating: a baseline (random; one_ply, negamax-<depth> on connect_four), "
                             "update:<N> or digest:<hex> (a snapshot of the run's pool), module:callable (an entry "
                             "point called as fn(seed=...) returning a player) or self "
                             f"(default {DEFAULT_OPPONENT})")
    parser.add_argument("--video", type=Path, default=None,
                        help="write env 0's episodes to this .mp4 (envs cartpole, gridworld, connect_four)")
    parser.add_argument("--fps", type=float, default=None,
                        help=f"frames per second of --video (default {VIDEO_FPS})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the env resets and the sampler (default 0)")
    return parser


def main(argv: Sequence[str] | None = None, *, prog: str = PROG) -> int:
    """Evaluate; 0 on success, 2 (with a one-line message on stderr) on a usage or input error."""
    args = build_parser(prog).parse_args(argv)
    try:
        summary = evaluate(args, note=lambda text: print(f"{prog}: note: {text}", file=sys.stderr))
    except (EvaluateError, LoadPolicyError, EnvConfigError, OpponentError) as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    print(f"mean return {summary.mean:.3f} +- {summary.half_width:.3f} (95% CI) over {summary.episodes} episodes, "
          f"mean length {summary.mean_length:.1f}")
    if summary.match is not None:
        print(format_match(summary.match))
    return 0


def evaluate(args: argparse.Namespace, note: Note | None = None) -> ReturnSummary:
    """Everything ``main`` does, raising ``EvaluateError`` / ``LoadPolicyError`` / ``OpponentError`` for bad input;
    ``note(text)`` is told when the opponent is the default one."""
    if args.episodes < 1:
        raise EvaluateError(f"--episodes must be an integer >= 1, got {args.episodes}")
    fps = getattr(args, "fps", None)
    if fps is not None:
        if args.video is None:
            raise EvaluateError("--fps needs --video (it sets the video's frames per second)")
        if not (math.isfinite(fps) and fps > 0):
            raise EvaluateError(f"--fps must be a number > 0, got {fps:g}")
    loaded = load_policy(args.run_dir, args.checkpoint)
    opponent = pick_opponent(args, loaded, note)
    draw = None
    if args.video is not None:
        try:
            draw = frame_drawer(loaded.config.env.name)
        except ValueError as err:
            raise EvaluateError(str(err)) from err
        if loaded.config.env.name in SELF_RENDERING_ENVS:  # a Gymnasium or PettingZoo env draws itself when made to
            loaded = rendering(loaded)
    frames: list[np.ndarray] = []

    def record(env: VecEnv, buffers: StepBuffers) -> None:
        frames.append(draw(env, buffers))

    observer = record if draw is not None else None
    if opponent is None:
        summary = summarise(run_episodes(loaded, episodes=args.episodes, deterministic=args.deterministic,
                                         seed=args.seed, observer=observer))
    else:
        summary = play_opponent(loaded, opponent, episodes=args.episodes, deterministic=args.deterministic,
                                seed=args.seed, observer=observer)
    if args.video is not None:
        write_video(args.video, frames, fps=VIDEO_FPS if fps is None else fps)
        print(f"wrote {len(frames)} frames to {args.video}")
    return summary


def pick_opponent(args: argparse.Namespace, loaded: LoadedPolicy, note: Note | None = None) -> Opponent | None:
    """The opponent of a two-player env's policy (None: the policy plays alone or against itself)."""
    text = getattr(args, "opponent", None)
    env_name = loaded.config.env.name
    if env_name not in TWO_PLAYER_ENVS or loaded.spec.num_agents != 2:
        if text is not None:
            allowed = ", ".join(map(repr, TWO_PLAYER_ENVS))
            agents = "" if env_name not in TWO_PLAYER_ENVS else f" with {loaded.spec.num_agents} agents"
            raise EvaluateError(f"--opponent needs a two-player turn-based env ({allowed}); the run's env.name is "
                                f"{env_name!r}{agents}")
        return None
    if text is None:
        text = DEFAULT_OPPONENT
        if note is not None:
            note(f"{env_name} is a two-player env: playing against the {DEFAULT_OPPONENT!r} baseline "
                 f"(--opponent picks another, --opponent self plays the policy against itself)")
    opponent = resolve_opponent(text, run_dir=args.run_dir, config=loaded.config, spec=loaded.spec,
                                greedy=args.deterministic, seed=args.seed)
    return None if opponent.name == SELF else opponent


def play_opponent(loaded: LoadedPolicy, opponent: Opponent, *, episodes: int, deterministic: bool, seed: int,
                  observer: MatchObserver | None = None) -> ReturnSummary:
    """``episodes`` games of the loaded policy against ``opponent``, seats alternating (``evaluation.arena``)."""
    try:
        policy = PolicyPlayer("policy", loaded.spec, loaded.config.model, state_arrays(loaded.policy),
                              greedy=deterministic, seed=seed, version=loaded.update)
    except ValueError as err:  # a recurrent core: the arena keeps no per-agent state
        raise EvaluateError(f"--opponent {opponent.name}: the arena plays feed-forward policies only, but the run's "
                            f"model.core {loaded.config.model.core!r} is recurrent; --opponent self plays the "
                            f"policy against itself") from err
    outcome = play_match(policy, opponent.player, episodes=episodes, env_config=loaded.config.env, seed=seed,
                         observer=observer)
    returns, lengths = outcome.returns_a, outcome.lengths_a
    return ReturnSummary(mean=float(returns.mean()), half_width=1.96 * float(returns.std()) / math.sqrt(len(returns)),
                         episodes=len(returns), mean_length=float(lengths.mean()),
                         match=MatchReport(opponent=opponent.name, outcome=outcome))


def format_match(report: MatchReport) -> str:
    """One line: the policy's win, draw and loss rates against the opponent, overall and per seat."""
    outcome = report.outcome
    parts = []
    for seat, label in ((0, "moving first"), (1, "moving second")):
        results = outcome.returns_a[outcome.seats_a == seat]
        parts.append(f"{label} {_record(results)}")
    return (f"against {report.opponent}: win {outcome.wins_a / outcome.games:.3f}, "
            f"draw {outcome.draws / outcome.games:.3f}, loss {outcome.wins_b / outcome.games:.3f} over "
            f"{outcome.games} games (W-D-L {outcome.wins_a}-{outcome.draws}-{outcome.wins_b}; seats alternated: "
            f"{', '.join(parts)})")


def _record(results: np.ndarray) -> str:
    """W-D-L of the games ``results`` (returns from the policy's side) and their count."""
    wins, losses = int((results > 0).sum()), int((results < 0).sum())
    return f"{wins}-{len(results) - wins - losses}-{losses} in {len(results)}"


def rendering(loaded: LoadedPolicy) -> LoadedPolicy:
    """``loaded`` with its Gymnasium or PettingZoo env made with ``render_mode='rgb_array'`` (added to env.kwargs)."""
    env = dataclasses.replace(loaded.config.env, kwargs={**loaded.config.env.kwargs, "render_mode": "rgb_array"})
    return dataclasses.replace(loaded, config=dataclasses.replace(loaded.config, env=env))


def write_video(path: Path, frames: list[np.ndarray], *, fps: float = VIDEO_FPS) -> None:
    """Encode ``frames`` [height, width, 3] uint8 as an H.264 mp4 at ``fps`` frames per second."""
    import imageio.v2 as imageio  # only --video needs it

    path.parent.mkdir(parents=True, exist_ok=True)
    with imageio.get_writer(str(path), fps=fps, codec="libx264", macro_block_size=16) as writer:
        for frame in frames:
            writer.append_data(frame)


if __name__ == "__main__":
    sys.exit(main())
