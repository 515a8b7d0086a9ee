"""`python -m evaluation.evaluate`: run a trained agent on its run's env and report its mean return.

    python -m evaluation.evaluate --run-dir runs/cartpole-... --episodes 100 [--checkpoint N] [--deterministic]
                               [--video out.mp4] [--seed S]

Loads ``config.yaml`` and a checkpoint's ``model.safetensors`` (the newest unless ``--checkpoint N`` names an
update), plays ``--episodes`` agent episodes in this process (``evaluation.episode_runner``) and prints the mean
return with a 95% confidence interval (mean +- 1.96 * std / sqrt(n)), the episode count and the mean length.
``--video`` writes env 0's episodes as an mp4 (imageio's ffmpeg plugin): the built-in cartpole, gridworld and
connect_four are drawn by ``evaluation.frames``, a Gymnasium env by its own ``render()`` (made with
render_mode='rgb_array'). Usage and input problems print one line ``python -m evaluation.evaluate: error: <message>``
on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from envs.base import StepBuffers, VecEnv
from envs.errors import EnvConfigError
from evaluation.episode_runner import EpisodeResults, run_episodes
from evaluation.frames import frame_drawer
from evaluation.load_policy import LoadedPolicy, LoadPolicyError, load_policy

PROG = "python -m evaluation.evaluate"
VIDEO_FPS = 30
"""Frames per second of ``--video``."""


class EvaluateError(ValueError):
    """A usage or input problem: reported as ``python -m evaluation.evaluate: error: <message>``, exit status 2."""


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


def summarise(results: EpisodeResults) -> ReturnSummary:
    """Mean, 95% confidence half-width, count and mean length of ``results``."""
    n = len(results.returns)
    return ReturnSummary(mean=float(results.returns.mean()),
                         half_width=1.96 * float(results.returns.std()) / math.sqrt(n),
                         episodes=n, mean_length=float(results.lengths.mean()))


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The command-line interface."""
    parser = argparse.ArgumentParser(prog=prog, description="Run a trained agent and report its mean return "
                                     "with a 95% confidence interval.")
    parser.add_argument("--run-dir", type=Path, required=True, help="run directory (holds config.yaml, checkpoints/)")
    parser.add_argument("--checkpoint", type=int, default=None,
                        help="update number of the checkpoint to load (default: the newest)")
    parser.add_argument("--episodes", type=int, default=100,
                        help="agent episodes to play (default 100; every agent of a multi-agent env counts)")
    parser.add_argument("--deterministic", action="store_true",
                        help="take the most probable legal action (the mean for box) instead of sampling")
    parser.add_argument("--video", type=Path, default=None,
                        help="write env 0's episodes to this .mp4 (envs cartpole, gridworld, connect_four)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the env resets and the sampler (default 0)")
    return parser


def main(argv: Sequence[str] | None = None, *, prog: str = PROG) -> int:
    """Evaluate; 0 on success, 2 (with a one-line message on stderr) on a usage or input error."""
    args = build_parser(prog).parse_args(argv)
    try:
        summary = evaluate(args)
    except (EvaluateError, LoadPolicyError, EnvConfigError) as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    print(f"mean return {summary.mean:.3f} +- {summary.half_width:.3f} (95% CI) over {summary.episodes} episodes, "
          f"mean length {summary.mean_length:.1f}")
    return 0


def evaluate(args: argparse.Namespace) -> ReturnSummary:
    """Everything ``main`` does, raising ``EvaluateError`` / ``LoadPolicyError`` for bad input."""
    if args.episodes < 1:
        raise EvaluateError(f"--episodes must be an integer >= 1, got {args.episodes}")
    loaded = load_policy(args.run_dir, args.checkpoint)
    if args.video is None:
        return summarise(run_episodes(loaded, episodes=args.episodes, deterministic=args.deterministic,
                                      seed=args.seed))
    try:
        draw = frame_drawer(loaded.config.env.name)
    except ValueError as err:
        raise EvaluateError(str(err)) from err
    if loaded.config.env.name == "gymnasium":  # a Gymnasium env draws itself when made to
        loaded = rendering(loaded)
    frames: list[np.ndarray] = []

    def record(env: VecEnv, buffers: StepBuffers) -> None:
        frames.append(draw(env, buffers))

    results = run_episodes(loaded, episodes=args.episodes, deterministic=args.deterministic, seed=args.seed,
                           observer=record)
    write_video(args.video, frames)
    print(f"wrote {len(frames)} frames to {args.video}")
    return summarise(results)


def rendering(loaded: LoadedPolicy) -> LoadedPolicy:
    """``loaded`` with its Gymnasium env made with ``render_mode='rgb_array'`` (added to env.kwargs)."""
    env = dataclasses.replace(loaded.config.env, kwargs={**loaded.config.env.kwargs, "render_mode": "rgb_array"})
    return dataclasses.replace(loaded, config=dataclasses.replace(loaded.config, env=env))


def write_video(path: Path, frames: list[np.ndarray]) -> None:
    """Encode ``frames`` [height, width, 3] uint8 as an H.264 mp4 at ``VIDEO_FPS``."""
    import imageio.v2 as imageio  # only --video needs it

    path.parent.mkdir(parents=True, exist_ok=True)
    with imageio.get_writer(str(path), fps=VIDEO_FPS, codec="libx264", macro_block_size=16) as writer:
        for frame in frames:
            writer.append_data(frame)


if __name__ == "__main__":
    sys.exit(main())
