"""`python -m evaluation.evaluate --opponent` on a two-player env (issue 32): the default opponent and its note,
baselines, pool snapshots by update or digest, entry points, ``self``, win/draw/loss per seat, ``--fps``, and every
error message."""

from __future__ import annotations

import re
from pathlib import Path

import imageio.v2 as imageio
import numpy as np
import pytest
import torch

from configs.loader import load_config
from envs.registry import env_spec
from evaluation import opponents
from evaluation.episode_runner import run_episodes
from evaluation.evaluate import main, summarise
from evaluation.load_policy import load_policy
from learner.pool.store import Snapshot, SnapshotStore
from policies.factory import make_policy, state_arrays
from tests.test_evaluate import SUMMARY, make_run_dir

PREFIX = "python -m evaluation.evaluate: error: "
C4 = ["env.name=connect_four", "env.num_agents=2", "model.hidden_size=16", "model.num_layers=1"]
AGAINST = re.compile(r"^against (\S+): win ([\d.]+), draw ([\d.]+), loss ([\d.]+) over (\d+) games "
                     r"\(W-D-L (\d+)-(\d+)-(\d+); seats alternated: moving first (\d+)-(\d+)-(\d+) in (\d+), "
                     r"moving second (\d+)-(\d+)-(\d+) in (\d+)\)$", re.MULTILINE)
NOTE = ("python -m evaluation.evaluate: note: connect_four is a two-player env: playing against the 'random' "
        "baseline (--opponent picks another, --opponent self plays the policy against itself)")


def add_pool(run_dir: Path, overrides: list[str], updates: tuple[int, ...]) -> SnapshotStore:
    """A pool of freshly initialised policies, one per update."""
    config = load_config(None, overrides)
    spec = env_spec(config.env)
    store = SnapshotStore(run_dir / "pool")
    for k, update in enumerate(updates):
        torch.manual_seed(100 + k)
        store.add(state_arrays(make_policy(spec, config.model)), update=update, policy_version=update + 1)
    return store


@pytest.fixture(scope="module")
def c4_run(tmp_path_factory) -> Path:
    run_dir = make_run_dir(tmp_path_factory.mktemp("c4") / "run", C4)
    add_pool(run_dir, C4, (0, 10, 20))
    return run_dir


def evaluate(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def against(out: str) -> dict:
    match = AGAINST.search(out)
    assert match, out
    name, *numbers = match.groups()
    win, draw, loss = map(float, numbers[:3])
    games, w, d, l, w1, d1, l1, n1, w2, d2, l2, n2 = map(int, numbers[3:])
    assert w + d + l == games and (w1 + w2, d1 + d2, l1 + l2) == (w, d, l)
    assert (w1 + d1 + l1, w2 + d2 + l2) == (n1, n2) and n1 == (games + 1) // 2 and n2 == games // 2
    assert (win, draw, loss) == pytest.approx((w / games, d / games, l / games), abs=5e-4)
    return {"name": name, "games": games, "wins": w, "draws": d, "losses": l}


def test_default_opponent_is_random_with_a_one_line_note(c4_run: Path, capsys) -> None:
    code, out, err = evaluate(capsys, "--run-dir", str(c4_run), "--episodes", "9", "--seed", "2")
    assert code == 0, err
    assert err.strip().splitlines() == [NOTE]
    summary = SUMMARY.search(out)
    assert int(summary.group(3)) == 9
    result = against(out)
    assert result["name"] == "random" and result["games"] == 9
    mean = (result["wins"] - result["losses"]) / 9  # Connect Four: +1 win, -1 loss, 0 draw
    assert float(summary.group(1)) == pytest.approx(mean, abs=5e-4)
    assert 1 <= float(summary.group(4)) <= 21  # the policy's own moves in a game
    assert evaluate(capsys, "--run-dir", str(c4_run), "--episodes", "9", "--seed", "2", "--opponent", "random")[1:] \
        == (out, "")  # naming the default: the same games, no note


def test_baselines_are_told_apart(c4_run: Path, capsys) -> None:
    results = {}
    for name in ("random", "one_ply", "negamax-2"):
        code, out, err = evaluate(capsys, "--run-dir", str(c4_run), "--episodes", "40", "--opponent", name,
                                  "--deterministic")
        assert code == 0 and err == "", err
        results[name] = against(out)
        assert results[name]["name"] == name
    assert results["one_ply"]["losses"] > results["random"]["losses"]
    assert results["negamax-2"]["losses"] >= 30


def test_self_is_the_old_self_play(c4_run: Path, capsys) -> None:
    code, out, err = evaluate(capsys, "--run-dir", str(c4_run), "--episodes", "6", "--opponent", "self")
    assert code == 0 and err == ""
    assert "against" not in out
    old = summarise(run_episodes(load_policy(c4_run), episodes=6, seed=0))
    assert out.strip() == (f"mean return {old.mean:.3f} +- {old.half_width:.3f} (95% CI) over 6 episodes, "
                           f"mean length {old.mean_length:.1f}")


def test_pool_snapshots_by_update_and_by_digest(c4_run: Path, capsys) -> None:
    store = SnapshotStore(c4_run / "pool")
    code, out, err = evaluate(capsys, "--run-dir", str(c4_run), "--episodes", "4", "--opponent", "update:10")
    assert code == 0 and err == ""
    assert against(out)["name"] == "s1-u10"
    for digest in (store.snapshot(2).hash, store.snapshot(2).hash[:8].upper()):
        code, out, err = evaluate(capsys, "--run-dir", str(c4_run), "--episodes", "4", "--opponent",
                                  f"digest:{digest}")
        assert code == 0 and err == "", err
        assert against(out)["name"] == "s2-u20"


class CountingPlayer:
    """An entry-point player: the first legal column; counts its calls and reseeds."""

    made = 0
    reseeds: list[int] = []

    def __init__(self, *, seed: int) -> None:
        CountingPlayer.made += 1
        self.name = "counting"
        self.calls = 0

    def reseed(self, seed: int) -> None:
        CountingPlayer.reseeds.append(seed)

    def act(self, obs: np.ndarray, masks: np.ndarray) -> np.ndarray:
        return (masks != 0).argmax(axis=1).astype(np.int32)


def make_counting_player(seed: int) -> CountingPlayer:
    return CountingPlayer(seed=seed)


def not_a_player(seed: int) -> int:
    return 3


def broken_player(seed: int) -> None:
    raise RuntimeError("no board")


NOT_CALLABLE = 5


@pytest.mark.parametrize("entry", ["tests.test_evaluate_opponent:CountingPlayer",
                                   "tests.test_evaluate_opponent:make_counting_player"])
def test_an_entry_point_player(entry: str, c4_run: Path, capsys) -> None:
    made = CountingPlayer.made
    CountingPlayer.reseeds.clear()
    code, out, err = evaluate(capsys, "--run-dir", str(c4_run), "--episodes", "6", "--opponent", entry)
    assert code == 0 and err == "", err
    assert against(out)["name"] == entry
    assert CountingPlayer.made == made + 1 and len(CountingPlayer.reseeds) == 1


def test_video_of_the_games_at_a_chosen_fps(c4_run: Path, tmp_path: Path, capsys) -> None:
    video = tmp_path / "games.mp4"
    code, out, err = evaluate(capsys, "--run-dir", str(c4_run), "--episodes", "3", "--opponent", "one_ply",
                              "--video", str(video), "--fps", "5")
    assert code == 0, err
    written = int(re.search(r"^wrote (\d+) frames to (.+)$", out, re.MULTILINE).group(1))
    with imageio.get_reader(str(video)) as reader:
        assert reader.get_meta_data()["fps"] == 5
        frames = list(reader.iter_data())
    assert len(frames) == written > 0 and frames[0].shape == (288, 336, 3)  # 6 x 7 cells of 48 pixels
    assert against(out)["games"] == 3


def test_fps_defaults_to_30_on_a_one_player_env(tmp_path: Path, capsys) -> None:
    run_dir = make_run_dir(tmp_path / "run", ["env.name=cartpole", "env.max_steps=10"])
    video = tmp_path / "v.mp4"
    code, out, err = evaluate(capsys, "--run-dir", str(run_dir), "--episodes", "1", "--video", str(video))
    assert code == 0 and err == "" and "against" not in out
    with imageio.get_reader(str(video)) as reader:
        assert reader.get_meta_data()["fps"] == 30


def error(capsys, run_dir: Path, *argv: str) -> str:
    code, out, err = evaluate(capsys, "--run-dir", str(run_dir), "--episodes", "2", *argv)
    assert code == 2 and out == "", out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(PREFIX), err
    return lines[0][len(PREFIX):]


FORMS = ("use a baseline (random, one_ply, negamax-<depth> (depth an integer >= 1; one_ply and negamax connect_four "
         "only) or an entry point module.path:callable (called as fn(seed=<int>), returning a player)), update:<N> or "
         "digest:<hex> (a snapshot of the run's pool) or self")


@pytest.mark.parametrize("spec, message", [
    ("bogus", f"--opponent 'bogus' is not an opponent; {FORMS}"),
    ("negamax-0", f"--opponent 'negamax-0' is not an opponent; {FORMS}"),
    ("a b:c", f"--opponent 'a b:c' is not an opponent; {FORMS}"),
    ("update:7", "--opponent 'update:7': no pool snapshot was taken after update 7; snapshot updates: 0, 10, 20"),
    ("update:x", "--opponent 'update:x': the update must be an integer >= 0, got 'x'"),
    ("digest:abc", "--opponent 'digest:abc': a digest must be at least 6 hex digits (a sha256 digest or its start)"),
    ("digest:zzzzzzzz", "--opponent 'digest:zzzzzzzz': a digest must be at least 6 hex digits (a sha256 digest or "
                        "its start)"),
    ("no_such_module_xyz:make", "--opponent 'no_such_module_xyz:make': module 'no_such_module_xyz' cannot be "
                                "imported: No module named 'no_such_module_xyz'"),
    ("tests.test_evaluate_opponent:nope", "--opponent 'tests.test_evaluate_opponent:nope': "
                                          "'tests.test_evaluate_opponent' has no attribute 'nope'"),
    ("tests.test_evaluate_opponent:NOT_CALLABLE", "--opponent 'tests.test_evaluate_opponent:NOT_CALLABLE' is not "
                                                  "callable (its type is int)"),
    ("tests.test_evaluate_opponent:broken_player", "--opponent 'tests.test_evaluate_opponent:broken_player': calling "
                                                   "it as fn(seed=0) raised RuntimeError('no board')"),
    ("tests.test_evaluate_opponent:not_a_player", "--opponent 'tests.test_evaluate_opponent:not_a_player' returned a "
                                                  "int, not a player (an object with act(obs, masks) -> actions)"),
])
def test_opponent_errors(spec: str, message: str, c4_run: Path, capsys) -> None:
    assert error(capsys, c4_run, "--opponent", spec) == message


def test_a_digest_that_matches_nothing(c4_run: Path, capsys) -> None:
    hashes = {s.hash for s in SnapshotStore(c4_run / "pool").snapshots}
    missing = next(p for p in ("000000", "111111", "222222", "333333") if not any(h.startswith(p) for h in hashes))
    assert error(capsys, c4_run, "--opponent", f"digest:{missing}") == (
        f"--opponent 'digest:{missing}': no pool snapshot's digest starts with '{missing}'")


def test_an_ambiguous_digest_and_a_long_list_of_updates() -> None:
    def snapshot(index: int, digest: str) -> Snapshot:
        return Snapshot(index=index, hash=digest, update=10 * index, policy_version=index, created=0.0, num_bytes=1)

    class Store:
        snapshots = (snapshot(0, "abcdef01" + "0" * 56), snapshot(1, "abcdef02" + "0" * 56),
                     *(snapshot(i, f"{i:064x}") for i in range(2, 14)))

    with pytest.raises(opponents.OpponentError) as info:
        opponents.find_snapshot(Store(), "digest:abcdef")
    assert str(info.value) == "--opponent 'digest:abcdef': 2 pool snapshots' digests start with 'abcdef'; give more digits"
    assert opponents.find_snapshot(Store(), "digest:abcdef02").index == 1
    with pytest.raises(opponents.OpponentError) as info:
        opponents.find_snapshot(Store(), "update:5")
    assert str(info.value) == ("--opponent 'update:5': no pool snapshot was taken after update 5; snapshot updates: "
                               "0, 10, 20, 30, 40, ... (4 more), 90, 100, 110, 120, 130")


def test_pool_errors(tmp_path: Path, capsys) -> None:
    run_dir = make_run_dir(tmp_path / "run", C4)
    pool = run_dir / "pool" / "index.json"
    assert error(capsys, run_dir, "--opponent", "update:0") == (
        f"--opponent names a pool snapshot, but {run_dir} has no snapshot pool ({pool} does not exist; was the run "
        f"trained with self-play?)")
    pool.parent.mkdir()
    pool.write_text('{"format": 1, "snapshots": []}')
    assert error(capsys, run_dir, "--opponent", "digest:abcdef") == (
        f"--opponent names a pool snapshot, but the pool {run_dir / 'pool'} is empty")


def test_a_snapshot_that_does_not_fit_the_model(tmp_path: Path, capsys) -> None:
    run_dir = make_run_dir(tmp_path / "run", C4)
    add_pool(run_dir, [*C4, "model.hidden_size=8"], (5,))
    message = error(capsys, run_dir, "--opponent", "update:5")
    assert message.startswith("--opponent: snapshot s0-u5 cannot play: Error(s) in loading state_dict"), message


def test_a_recurrent_policy_needs_opponent_self(tmp_path: Path, capsys) -> None:
    run_dir = make_run_dir(tmp_path / "run", [*C4, "model.core=lstm"])
    code, out, err = evaluate(capsys, "--run-dir", str(run_dir), "--episodes", "2")
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        NOTE, f"{PREFIX}--opponent random: the arena plays feed-forward policies only, but the run's model.core "
              f"'lstm' is recurrent; --opponent self plays the policy against itself"]
    code, out, err = evaluate(capsys, "--run-dir", str(run_dir), "--episodes", "2", "--opponent", "self")
    assert code == 0 and err == "" and int(SUMMARY.search(out).group(3)) == 2


def test_opponent_on_a_one_player_env_and_fps_errors(tmp_path: Path, capsys) -> None:
    run_dir = make_run_dir(tmp_path / "run", ["env.name=cartpole", "env.max_steps=10"])
    assert error(capsys, run_dir, "--opponent", "random") == (
        "--opponent needs a two-player turn-based env ('connect_four', 'pettingzoo_aec'); the run's env.name is "
        "'cartpole'")
    assert error(capsys, run_dir, "--fps", "10") == "--fps needs --video (it sets the video's frames per second)"
    video = str(tmp_path / "v.mp4")
    assert error(capsys, run_dir, "--video", video, "--fps", "0") == "--fps must be a number > 0, got 0"
    assert error(capsys, run_dir, "--video", video, "--fps", "-2.5") == "--fps must be a number > 0, got -2.5"
    assert error(capsys, run_dir, "--video", video, "--fps", "nan") == "--fps must be a number > 0, got nan"
    assert not Path(video).exists()


def test_fps_that_is_not_a_number_is_an_argparse_error(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--run-dir", str(tmp_path), "--fps", "fast"])
    assert exc.value.code == 2
    assert "python -m evaluation.evaluate: error: argument --fps: invalid float value: 'fast'" in capsys.readouterr().err
