"""`python -m evaluation.plot RUN [RUN ...]`: one metric of one or more runs against agent steps or time, as a PNG.

Runs whose config.yaml is the same apart from run.seed and run.name are one group, drawn as the mean over its
seeds with a band (min-max, or one standard deviation) on a common x grid; a run alone is drawn as its own line.

After writing, one line on stdout names the PNG's absolute path. A run with no update recorded yet (an empty
metrics.jsonl, or a config.yaml without one) prints ``python -m evaluation.plot: no updates recorded yet in <path>``
on stderr, writes nothing and exits with status 1; usage and input errors print ``python -m evaluation.plot:
error: <message>`` and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from learner.run.jsonl import json_records

PROG = "python -m evaluation.plot"
X_AXES = ("agent_steps", "elapsed_s")
BANDS = ("minmax", "std")
GRID_POINTS = 200
BASELINE_COLORS = ("grey", "black", "tab:brown", "tab:pink")
"""The dashed baseline levels' colours, in order (cycled)."""
IGNORED_CONFIG_KEYS = ("seed", "name")
"""Keys of the config's run section that do not make two runs different experiments."""


NO_UPDATES_EXIT = 1
"""Exit status when a run has no update recorded yet (nothing to plot, but nothing wrong either)."""


class PlotError(ValueError):
    """The runs or the metric cannot be plotted as asked."""


class NoUpdatesError(PlotError):
    """A run directory has not recorded an update yet (its learner has just started, or never got that far)."""


@dataclass(frozen=True, kw_only=True)
class Run:
    """One run directory's metric curve."""

    name: str
    """run.name from its config.yaml (the directory's name without one)."""
    directory: Path
    """The run directory."""
    config_key: str
    """Its config without run.seed and run.name, as canonical JSON: equal keys are the same experiment."""
    x: np.ndarray
    """The x value of each record that has the metric."""
    y: np.ndarray
    """The metric at each x."""


@dataclass(frozen=True, kw_only=True)
class Curve:
    """What one legend entry draws: a run's line, or a group's mean with its band."""

    label: str
    """The legend text."""
    x: np.ndarray
    """The x grid."""
    mean: np.ndarray
    """The line (a single run's values, or the mean over the group's runs)."""
    low: np.ndarray | None
    """The band's lower edge (None for a single run)."""
    high: np.ndarray | None
    """The band's upper edge (None for a single run)."""


def read_records(directory: Path) -> list[dict]:
    """The whole records of a run's metrics.jsonl."""
    path = directory / "metrics.jsonl"
    if not path.is_file():
        if (directory / "config.yaml").is_file():
            raise NoUpdatesError(f"no updates recorded yet in {directory} (it has a config.yaml but no metrics.jsonl)")
        raise PlotError(f"{directory} has no metrics.jsonl (is it a run directory?)")
    records = json_records(path.read_text().splitlines())
    if not records:
        raise NoUpdatesError(f"no updates recorded yet in {path}")
    return records


def config_key(directory: Path) -> str:
    """The run's config without run.seed and run.name as canonical JSON ("" without a config.yaml)."""
    path = directory / "config.yaml"
    if not path.is_file():
        return ""
    config = yaml.safe_load(path.read_text()) or {}
    run_section = {k: v for k, v in config.get("run", {}).items() if k not in IGNORED_CONFIG_KEYS}
    return json.dumps({**config, "run": run_section}, sort_keys=True)


def load_run(directory: Path, *, metric: str, x_axis: str) -> Run:
    """One run's curve of ``metric`` against ``x_axis``."""
    records = read_records(directory)
    available = sorted({k for r in records for k, v in r.items() if isinstance(v, (int, float))
                        and not isinstance(v, bool)})
    if metric not in available:
        raise PlotError(f"unknown metric {metric!r} in {directory}/metrics.jsonl; available: {', '.join(available)}")
    points = [(r[x_axis], r[metric]) for r in records if r.get(metric) is not None and r.get(x_axis) is not None]
    if not points:
        raise PlotError(f"{directory}/metrics.jsonl has no record with both {metric!r} and {x_axis!r}")
    x, y = (np.asarray(column, dtype=np.float64) for column in zip(*points))
    config_path = directory / "config.yaml"
    config = yaml.safe_load(config_path.read_text()) if config_path.is_file() else {}
    name = str((config or {}).get("run", {}).get("name", directory.name))
    return Run(name=name, directory=directory, config_key=config_key(directory), x=x, y=y)


def group_runs(runs: Sequence[Run]) -> list[list[Run]]:
    """Runs with the same config_key together (a run without a config.yaml alone), in first-seen order."""
    groups: dict[str, list[Run]] = {}
    for index, run in enumerate(runs):
        groups.setdefault(run.config_key or f"alone-{index}", []).append(run)
    return list(groups.values())


def group_curve(group: Sequence[Run], *, band: str) -> Curve:
    """A single run's line, or a group's mean and band interpolated on the x range all its runs cover."""
    if len(group) == 1:
        run = group[0]
        return Curve(label=f"{run.name} ({run.directory.name})", x=run.x, mean=run.y, low=None, high=None)
    start, stop = max(run.x.min() for run in group), min(run.x.max() for run in group)
    grid = np.linspace(start, stop, GRID_POINTS) if stop > start else np.array([start])
    values = np.stack([np.interp(grid, run.x, run.y) for run in group])
    mean = values.mean(axis=0)
    if band == "std":
        spread = values.std(axis=0)
        low, high = mean - spread, mean + spread
    else:
        low, high = values.min(axis=0), values.max(axis=0)
    names = ", ".join(dict.fromkeys(run.name for run in group))
    band_text = "±1 std" if band == "std" else "min-max"
    return Curve(label=f"{names} (mean, {band_text} over {len(group)} seeds)", x=grid, mean=mean, low=low, high=high)


def draw(curves: Sequence[Curve], *, metric: str, x_axis: str, out: Path,
         baselines: Sequence[tuple[str, float]] = ()) -> None:
    """Write the curves as a PNG at ``out``, with each ``(label, value)`` of ``baselines`` as a dashed level."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.2))
    for curve in curves:
        (line,) = axes.plot(curve.x, curve.mean, label=curve.label)
        if curve.low is not None and curve.high is not None:
            axes.fill_between(curve.x, curve.low, curve.high, color=line.get_color(), alpha=0.25, linewidth=0)
    for index, (label, value) in enumerate(baselines):
        color = BASELINE_COLORS[index % len(BASELINE_COLORS)]
        axes.axhline(value, linestyle="--", color=color, linewidth=1, label=label)
    axes.set_xlabel(x_axis)
    axes.set_ylabel(metric)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110)
    plt.close(figure)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN", help="run directories")
    parser.add_argument("--metric", default="episode_return_mean", help="a numeric key of metrics.jsonl")
    parser.add_argument("--x", dest="x_axis", choices=X_AXES, default="agent_steps", help="the x axis")
    parser.add_argument("--band", choices=BANDS, default="minmax", help="a group's spread over its seeds")
    parser.add_argument("--out", type=Path, default=Path("plot.png"), help="the PNG to write")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        runs = [load_run(directory, metric=args.metric, x_axis=args.x_axis) for directory in args.runs]
    except NoUpdatesError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return NO_UPDATES_EXIT
    except PlotError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    curves = [group_curve(group, band=args.band) for group in group_runs(runs)]
    draw(curves, metric=args.metric, x_axis=args.x_axis, out=args.out)
    print(f"{PROG}: wrote {args.out.resolve()} ({len(runs)} runs, {len(curves)} curves)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
