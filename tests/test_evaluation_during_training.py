"""Evaluation during training (issue 16, parts 4 and 5): the evaluator child process, the best snapshot it keeps,
the learner's tail of evaluation.jsonl, the evaluation config section, and a real learner + actors run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from configs.loader import ConfigError, load_config
from evaluation import during_training, kept_best_gate
from evaluation.arena import MatchOutcome, PolicyPlayer, play_match
from evaluation.best_snapshot import BEST_DIR, BEST_NAME, KeptBest, kept_best_lineage, read_best, write_best
from evaluation.during_training import EvaluationSettings, Evaluator, due_snapshots, is_new_best
from evaluation.elo import pairing_seed
from evaluation.kept_best_gate import GateResult, KeptBestGate
from learner.monitor.evaluation_results import ResultsTail, evaluation_line, evaluation_metrics
from learner.pool.store import Snapshot, SnapshotStore
from learner.run.run_dir import read_run_config
from tests.processes import REPO, Run, alive, descendants, wait_for
from tests.test_elo import make_run


def _settings(**changes) -> EvaluationSettings:
    values = {"interval_updates": 10, "games": 4, "baselines": ("random", "one_ply"), "greedy": False, "seed": 0}
    return EvaluationSettings(**{**values, **changes})


def _evaluator(run_dir: Path, **changes) -> Evaluator:
    return Evaluator(run_dir, read_run_config(run_dir), SnapshotStore(run_dir / "pool"), _settings(**changes))


def _lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "evaluation.jsonl").read_text().splitlines()]


def _snapshot(update: int) -> Snapshot:
    return Snapshot(index=update, hash="0" * 64, update=update, policy_version=update, created=0.0, num_bytes=1)


# --- which snapshots are due, and the best-selection rule ----------------------------------------------------


def test_due_snapshots_keep_the_interval_from_the_last_evaluated():
    snapshots = [_snapshot(u) for u in (0, 10, 20, 30, 40, 50, 60, 70)]
    assert [s.update for s in due_snapshots(snapshots, last_update=0, interval_updates=25)] == [30, 60]
    assert [s.update for s in due_snapshots(snapshots, last_update=30, interval_updates=10)] == [40, 50, 60, 70]
    assert [s.update for s in due_snapshots(snapshots, last_update=0, interval_updates=1)] == [10, 20, 30, 40, 50,
                                                                                              60, 70]
    assert due_snapshots(snapshots, last_update=70, interval_updates=5) == []


def _reference_best(means: list[float]) -> list[int]:
    """The index of the best so far after each evaluation: the highest mean, the latest among equals."""
    best = []
    for k in range(len(means)):
        top = max(means[: k + 1])
        best.append(max(i for i in range(k + 1) if means[i] == top))
    return best


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0]) | st.floats(0, 1), min_size=1, max_size=30))
def test_best_rule_matches_a_reference_and_never_gets_worse(means):
    best, best_mean, chosen = None, None, []
    for k, mean in enumerate(means):
        if is_new_best(mean, best_mean):
            best, best_mean = k, mean
        chosen.append(best)
    assert chosen == _reference_best(means)
    kept = [means[k] for k in chosen]
    assert kept == sorted(kept)  # the kept best never gets worse


# --- the evaluator on a synthetic run directory --------------------------------------------------------------


@pytest.fixture
def scripted_run(tmp_path, monkeypatch):
    """A fake run with 6 snapshots (updates 0..50) whose games are scripted: snapshot k scores SCRIPT[k]."""
    run_dir = make_run(tmp_path / "run", 6)
    script = {0: (0, 4), 10: (2, 2), 20: (1, 0), 30: (3, 1), 40: (2, 2), 50: (0, 0)}  # update -> (wins, draws) of 4

    def fake_match(a, b, *, episodes, env_config, seed=0):
        wins, draws = script[a.inference.version]
        return MatchOutcome(wins_a=wins, draws=draws, wins_b=episodes - wins - draws, a_first=episodes // 2)

    for module in (during_training, kept_best_gate):
        monkeypatch.setattr(module, "play_match", fake_match)
        monkeypatch.setattr(module, "PolicyPlayer", _VersionPlayer)
    return run_dir


class _VersionPlayer:
    """Stands in for PolicyPlayer: remembers the snapshot's update (its policy_version in make_run is 10k + 1)."""

    def __init__(self, name, spec, model, arrays, *, greedy, seed, version):
        self.inference = type("I", (), {"version": (version - 1)})()
        self.greedy = greedy


def test_evaluator_writes_lines_and_keeps_the_best(scripted_run):
    evaluator = _evaluator(scripted_run, interval_updates=10)
    done = evaluator.evaluate_due()
    assert [e.snapshot.update for e in done] == [10, 20, 30, 40, 50]
    lines = _lines(scripted_run)
    assert [line["update"] for line in lines] == [10, 20, 30, 40, 50]
    assert [line["policy_version"] for line in lines] == [11, 21, 31, 41, 51]
    for line in lines:
        for result in line["baselines"].values():
            assert result["wins"] + result["draws"] + result["losses"] == result["games"] == 4
            assert result["score"] == pytest.approx((result["wins"] + result["draws"] / 2) / 4)
        assert line["mean_score"] == pytest.approx(sum(r["score"] for r in line["baselines"].values()) / 2)
    # means: u10 0.75, u20 0.25, u30 0.875, u40 0.75, u50 0.0 -> the best is u10, then u30 from there on
    assert [line["best_update"] for line in lines] == [10, 10, 30, 30, 30]
    best = read_best(scripted_run)
    assert best["update"] == 30 and best["mean_score"] == pytest.approx(0.875)
    assert best["scores"] == {"random": 0.875, "one_ply": 0.875}
    store = SnapshotStore(scripted_run / "pool")
    entry = store.snapshot(3)
    assert best["source"] == {"pool_index": 3, "hash": entry.hash, "path": f"pool/weights/{entry.hash}.safetensors"}
    assert (scripted_run / BEST_DIR / best["weights"]).read_bytes() == store.read_bytes(entry.hash)
    assert sorted(p.name for p in (scripted_run / BEST_DIR).iterdir()) == sorted([BEST_NAME, best["weights"]])
    # a restarted evaluator continues after the last line and keeps the best it finds
    again = _evaluator(scripted_run, interval_updates=10)
    assert (again.last_update, again.best_update) == (50, 30) and again.evaluate_due() == []


def test_a_tie_moves_the_best_to_the_newer_snapshot(scripted_run):
    evaluator = _evaluator(scripted_run, interval_updates=10)
    for index in (1, 4):  # u10 and u40 both score 0.75
        evaluator.evaluate(evaluator.store.snapshot(index))
    assert read_best(scripted_run)["update"] == 40


def test_the_gate_keeps_a_best_that_its_challenger_cannot_beat_head_to_head(scripted_run, monkeypatch):
    head_to_head = {(30, 10): 0.25, (40, 10): 0.75}  # (challenger, kept best) -> score, no draws
    against_baselines = during_training.play_match

    def fake_match(a, b, *, episodes, env_config, seed=0):
        if not isinstance(b, _VersionPlayer):
            assert a.greedy  # the evaluation's play mode against the baselines
            return against_baselines(a, b, episodes=episodes, env_config=env_config, seed=seed)
        assert not a.greedy and not b.greedy  # the gate samples: two greedy players would replay two games
        wins = round(head_to_head[(a.inference.version, b.inference.version)] * episodes)
        return MatchOutcome(wins_a=wins, draws=0, wins_b=episodes - wins, a_first=episodes // 2)

    for module in (during_training, kept_best_gate):
        monkeypatch.setattr(module, "play_match", fake_match)
    _evaluator(scripted_run, interval_updates=10, gate_games=200, greedy=True).evaluate_due()
    lines = _lines(scripted_run)
    # means: u10 0.75 (the first best: no gate), u20 0.25, u30 0.875 but 0.25 against u10 (u10 stays),
    # u40 0.75 (a tie with u10) and 0.75 against it (u40 is the best), u50 0.0
    assert [line["best_update"] for line in lines] == [10, 10, 10, 40, 40]
    assert not any("against_best" in lines[k] for k in (0, 1, 4))
    bar = 0.5 + 2 * (0.25 / 200) ** 0.5
    assert lines[2]["against_best"] == pytest.approx({"wins": 50, "draws": 0, "losses": 150, "games": 200,
                                                      "score": 0.25, "bar": bar})
    assert lines[3]["against_best"]["score"] == 0.75 and read_best(scripted_run)["update"] == 40
    assert [lines[2]["gate_passed"], lines[3]["gate_passed"]] == [False, True]
    assert not any("against_earlier_bests" in line for line in lines)  # u10 had no kept best before it
    assert read_best(scripted_run)["mean_score"] == pytest.approx(0.75)


def test_the_gate_also_compares_the_challenger_with_the_kept_best_against_the_earlier_bests(scripted_run,
                                                                                            monkeypatch):
    baselines = {10: 0.5, 20: 0.75, 30: 0.75, 40: 1.0, 50: 1.0}  # update -> score against each baseline: all
    # challengers. (a, b) -> score, no draws. Head-to-head: every challenger wins 0.75 against the kept best.
    # Against the earlier kept bests: u30 scores 0.5 against u10 where the kept u20 scored 0.75 (rejected); u40
    # 0.74, within the tolerance (passes); u50 (0.75 + 0.25) / 2 against u40's (0.74 + 0.75) / 2 (rejected)
    games = {(20, 10): 0.75, (30, 20): 0.75, (40, 20): 0.75, (50, 40): 0.75, (30, 10): 0.5, (40, 10): 0.74,
             (50, 10): 0.75, (50, 20): 0.25}
    seeds: dict[tuple[int, int], int] = {}

    def fake_match(a, b, *, episodes, env_config, seed=0):
        if not isinstance(b, _VersionPlayer):
            score = baselines[a.inference.version]
        else:
            assert not a.greedy and not b.greedy
            pair = (a.inference.version, b.inference.version)
            score = games[pair]
            seeds[pair] = seed  # the last: a kept best replays its head-to-head pair in a later lineage game
        wins = round(score * episodes)
        return MatchOutcome(wins_a=wins, draws=0, wins_b=episodes - wins, a_first=episodes // 2)

    for module in (during_training, kept_best_gate):
        monkeypatch.setattr(module, "play_match", fake_match)
    evaluator = _evaluator(scripted_run, interval_updates=10, gate_games=400, greedy=True)
    evaluator.evaluate_due()
    lines = _lines(scripted_run)
    assert [line["best_update"] for line in lines] == [10, 20, 20, 40, 40]
    assert [line.get("gate_passed") for line in lines] == [None, True, False, True, False]
    assert "against_earlier_bests" not in lines[1]  # u10 was the first kept best: nothing before it

    def tolerance(mine, theirs):  # 2 standard errors of the difference of the means, 400 games a score
        return 2 * (sum(p * (1 - p) for p in (*mine, *theirs)) / 400) ** 0.5 / len(mine)

    for line, updates, mine, theirs in ((lines[2], [10], [0.5], [0.75]), (lines[3], [10], [0.74], [0.75]),
                                        (lines[4], [10, 20], [0.75, 0.25], [0.74, 0.75])):
        got = line["against_earlier_bests"]
        assert (got["updates"], got["games"], got["scores"], got["kept_best_scores"]) == (updates, 400, mine, theirs)
        assert (got["score"], got["kept_best_score"], got["tolerance"]) == pytest.approx(
            (sum(mine) / len(mine), sum(theirs) / len(theirs), tolerance(mine, theirs)))
    assert 0.01 < tolerance([0.74], [0.75]) < 0.25 / 2  # the margins above are on either side of it
    # the challenger and the kept best meet the same games of an earlier kept best
    assert seeds[(30, 10)] == seeds[(20, 10)] and seeds[(50, 20)] == seeds[(40, 20)] != seeds[(50, 10)]
    assert [k.update for k in evaluator.lineage] == [10, 20, 40]
    again = _evaluator(scripted_run, interval_updates=10, gate_games=400)  # a restarted evaluator: the same lineage
    assert again.lineage == evaluator.lineage and again.best_update == 40


def test_the_lineage_reads_evaluation_jsonl_and_a_newer_best_json(tmp_path):
    path = tmp_path / "evaluation.jsonl"
    assert kept_best_lineage(path) == []
    lines = [{"update": 10, "policy_version": 11, "hash": "a", "best_update": 10},
             {"update": 20, "policy_version": 21, "hash": "b", "best_update": 10},
             "torn {", {"update": 30, "policy_version": "x", "hash": "c", "best_update": 30},
             {"update": 30, "policy_version": 31, "hash": "c", "best_update": 30}]
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
    kept = [KeptBest(update=10, policy_version=11, hash="a"), KeptBest(update=30, policy_version=0, hash="c")]
    assert kept_best_lineage(path) == kept
    newer = {"update": 40, "policy_version": 41, "source": {"hash": "d"}}
    assert kept_best_lineage(path, newer) == [*kept, KeptBest(update=40, policy_version=41, hash="d")]
    assert kept_best_lineage(path, {"update": 30, "source": {"hash": "c"}}) == kept


def test_the_gate_with_real_games_replays_the_challengers_games_for_the_kept_best(tmp_path):
    run_dir = make_run(tmp_path / "run", 4)
    config, store = read_run_config(run_dir), SnapshotStore(run_dir / "pool")
    spec = during_training.env_spec(config.env)
    write_best(run_dir / BEST_DIR, store.snapshot(2), store.read_bytes(store.snapshot(2).hash),
               scores={"random": 0.5}, games={"random": 6})
    gate = KeptBestGate(run_dir, config, spec, store, games=6, seed=3)
    challenger, kept, earlier = store.snapshot(3), store.snapshot(2), store.snapshot(1)
    result = gate.judge(store.load(3), challenger.policy_version, best=read_best(run_dir),
                        earlier=[KeptBest(update=earlier.update, policy_version=earlier.policy_version,
                                          hash=earlier.hash),
                                 KeptBest(update=99, policy_version=0, hash="0" * 64)])  # not in the pool: left out

    def score(a, b, b_name):
        players = [PolicyPlayer(name, spec, config.model, store.load(s.index), version=s.policy_version)
                   for name, s in (("x", a), ("y", b))]
        return play_match(*players, episodes=6, env_config=config.env,
                          seed=pairing_seed(3, "snapshot", b_name)).score_a

    assert result.against_best.games == 6
    assert result.against_best.score_a == score(challenger, kept, "kept_best")
    if result.against_best.score_a >= kept_best_gate.head_to_head_bar(6):
        assert result.earlier == (earlier.update,)
        assert result.challenger_score == score(challenger, earlier, f"kept_best@{earlier.update}")
        assert result.kept_best_score == score(kept, earlier, f"kept_best@{earlier.update}")
        assert result.passed == (result.challenger_score >= result.kept_best_score - result.tolerance)
    else:
        assert result.earlier == () and not result.passed


@pytest.mark.parametrize(("head_to_head", "mine", "theirs", "passed"), [
    (0.75, (), (), True), (0.5, (), (), False), (0.56, (), (), False), (0.575, (), (), True),
    (0.75, (0.5,), (0.5,), True), (0.75, (0.9, 0.9), (0.92, 0.92), True),
    (0.75, (0.86, 0.86), (0.92, 0.92), False), (0.5, (0.9,), (0.1,), False), (0.75, (1.0,), (1.0,), True),
    (0.75, (0.99,), (1.0,), True), (0.75, (0.95,), (1.0,), False)])
def test_gate_verdict_against_a_reference(head_to_head, mine, theirs, passed):
    """Rules 1 and 2 against a NumPy reference, 200 games a score: the head-to-head at least 0.5 plus 2 standard
    errors of an even score; reject when the mean against the earlier kept bests is more than 2 standard errors of
    the difference below the kept best's."""
    import numpy as np

    wins = round(head_to_head * 200)
    result = GateResult(against_best=MatchOutcome(wins_a=wins, draws=0, wins_b=200 - wins),
                        earlier=tuple(range(len(mine))), challenger_scores=mine, kept_best_scores=theirs, games=200)
    if mine:
        a, b = np.array(mine), np.array(theirs)
        se = np.sqrt((a * (1 - a)).sum() / 200 + (b * (1 - b)).sum() / 200) / len(a)
        assert result.tolerance == pytest.approx(2 * se)
        assert passed == (head_to_head >= 0.5 + 2 * np.sqrt(0.25 / 200) and a.mean() >= b.mean() - 2 * se)
    assert kept_best_gate.head_to_head_bar(200) == pytest.approx(0.5707, abs=1e-4)
    assert result.passed == passed and result.record()["gate_passed"] == passed


def test_best_write_is_atomic(scripted_run, monkeypatch):
    evaluator = _evaluator(scripted_run, interval_updates=10)
    evaluator.evaluate(evaluator.store.snapshot(1))
    before = {p.name: p.read_bytes() for p in (scripted_run / BEST_DIR).iterdir()}
    real_replace = os.replace

    def crash_on_best_json(src, dst):
        if str(dst).endswith(BEST_NAME):
            raise OSError("disk gone")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", crash_on_best_json)
    with pytest.raises(OSError, match="disk gone"):
        evaluator.evaluate(evaluator.store.snapshot(3))  # a new best: its weights land, best.json does not
    best = read_best(scripted_run)
    assert best["update"] == 10 and (scripted_run / BEST_DIR / best["weights"]).read_bytes() == before[best["weights"]]
    assert not [p for p in (scripted_run / BEST_DIR).iterdir() if p.name.startswith(".tmp-")]


def test_real_games_and_the_cli(tmp_path, capsys):
    run_dir = make_run(tmp_path / "run", 3)
    code = during_training.main(["--run-dir", str(run_dir), "--once", "--interval-updates", "10", "--games", "6",
                                 "--baselines", "random,negamax-1", "--gate-games", "4"])
    assert code == 0, capsys.readouterr().err
    lines = _lines(run_dir)
    assert [line["update"] for line in lines] == [10, 20]
    assert all(r["games"] == 6 for line in lines for r in line["baselines"].values())
    assert read_best(run_dir)["update"] in (10, 20) and "against_best" not in lines[0]
    if lines[1]["mean_score"] >= lines[0]["mean_score"]:  # a challenger: it played the kept best (real games)
        against = lines[1]["against_best"]
        assert against["games"] == 4 and (lines[1]["best_update"] == 20) == (against["score"] >= against["bar"])
        assert lines[1]["gate_passed"] == (lines[1]["best_update"] == 20)
    for argv, message in ((["--games", "5"], "--games must be even"),
                          (["--baselines", "random,two_ply"], "--baselines 'random,two_ply'"),
                          (["--interval-updates", "0"], "--interval-updates must be >= 1"),
                          (["--gate-games", "3"], "--gate-games must be even and >= 0")):
        assert during_training.main(["--run-dir", str(run_dir), "--once", *argv]) == 2
        err = capsys.readouterr().err
        assert err.startswith("python -m evaluation.during_training: error: ") and message in err
    assert during_training.main(["--run-dir", str(tmp_path / "nothing"), "--once"]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.integration
def test_the_evaluator_exits_when_its_parent_is_gone(tmp_path):
    run_dir = make_run(tmp_path / "run", 1)
    parent = (f"import os, subprocess, sys; child = subprocess.Popen([sys.executable, '-m', 'evaluation.during_training', "
              f"'--run-dir', {str(run_dir)!r}, '--poll-s', '0.2', '--parent-pid', str(os.getpid())]); "
              f"print(child.pid, flush=True)")
    done = subprocess.run([sys.executable, "-c", parent], cwd=REPO, capture_output=True, text=True, timeout=30)
    child = int(done.stdout.split()[0])
    try:
        assert wait_for(lambda: not alive(child), 30), "the evaluator outlived its parent"
    finally:
        if alive(child):
            os.kill(child, signal.SIGKILL)


# --- the learner's side: tailing evaluation.jsonl ------------------------------------------------------------


def test_tail_ignores_a_partial_line_and_resumes(tmp_path):
    path = tmp_path / "evaluation.jsonl"
    path.write_text('{"update": 1}\n')
    tail = ResultsTail(path)  # starts at the end: what was there before is not reported again
    assert tail.read_new() == []
    with path.open("a") as file:
        file.write('{"update": 2}\n{"upda')
    assert tail.read_new() == [{"update": 2}]
    assert tail.read_new() == []
    with path.open("a") as file:
        file.write('te": 3}\nnot json\n{"update": 4}\n')
    assert tail.read_new() == [{"update": 3}, {"update": 4}]
    assert ResultsTail(tmp_path / "missing.jsonl").read_new() == []


def test_console_line_and_metrics_of_an_evaluation():
    record = {"update": 250, "best_update": 250, "baselines": {"one_ply": {"score": 0.83}, "negamax-2": {"score": 0.41}}}
    assert evaluation_line(record) == "eval upd 250: one_ply 0.83, negamax-2 0.41 (best: upd 250)"
    assert evaluation_metrics(record) == {"eval_score_one_ply": 0.83, "eval_score_negamax-2": 0.41,
                                          "eval_best_update": 250}


# --- config ---------------------------------------------------------------------------------------------------


def test_evaluation_defaults_and_the_connect_four_config():
    assert load_config(None).evaluation.interval_updates == 0
    section = load_config("configs/selfplay_connect4.yaml").evaluation
    assert section.interval_updates > 0 and section.games % 2 == 0 and section.baselines == ["one_ply", "negamax-4"]
    assert load_config(None).evaluation.gate_games == 0


@pytest.mark.parametrize("overrides, message", [
    (["evaluation.games=7"], "evaluation.games must be even"),
    (["evaluation.games=0"], "evaluation.games: 0 is out of range; allowed: >= 2"),
    (["evaluation.interval_updates=-1"], "evaluation.interval_updates: -1 is out of range; allowed: >= 0"),
    (["evaluation.gate_games=3"], "evaluation.gate_games must be even (each seat played equally often), got 3"),
    (["evaluation.gate_games=-2"], "evaluation.gate_games: -2 is out of range; allowed: >= 0"),
    (["evaluation.baselines=[one_ply, two_ply]"],
     "evaluation.baselines: unknown baseline 'two_ply'; allowed: random, one_ply, negamax-<depth>"),
    (["evaluation.baselines=[negamax-0]"], "unknown baseline 'negamax-0'"),
    (["evaluation.baselines=[random, random]"], "evaluation.baselines names a baseline twice"),
    (["evaluation.baselines=[]"], "evaluation.baselines: expected a non-empty list"),
    (["evaluation.interval_updates=5"], "env.name 'cartpole' has none (allowed: connect_four, pettingzoo_aec)"),
    (["evaluation.interval_updates=5", "selfplay.enabled=false"], "selfplay.enabled must be true"),
])
def test_evaluation_config_errors(overrides, message):
    path = None if "selfplay.enabled=false" not in overrides else "configs/selfplay_connect4.yaml"
    with pytest.raises(ConfigError, match="evaluation") as caught:
        load_config(path, overrides)
    assert message in str(caught.value)


# --- a real learner with actors -------------------------------------------------------------------------------

SMALL = ["--set", "trainer.batch_size=2048", "--set", "trainer.minibatch_size=1024",
         "--set", "trainer.forward_pass_minibatch_target_size=32", "--set", "trainer.total_timesteps=10000000",
         "--set", "selfplay.snapshot_interval=2", "--set", "selfplay.alternation_steps=40",
         "--set", "model.hidden_size=32", "--set", "evaluation.interval_updates=2", "--set", "evaluation.games=10",
         "--set", "evaluation.baselines=[random, one_ply]"]


@pytest.mark.integration
def test_learner_runs_the_evaluator_and_leaves_nothing_behind(tmp_path):
    run = Run(tmp_path, *SMALL, config="configs/selfplay_connect4.yaml")
    try:
        learner = run.learner()
        actors = run.actors(2)
        run.note_workers(actors)
        assert wait_for(lambda: "eval upd" in run.log("learner.log"), 60), run.log("learner.log")
        with urllib.request.urlopen(f"http://127.0.0.1:{run.port + 3}/metrics", timeout=10) as reply:
            exposed = reply.read().decode()
        assert 'sluice_eval_score{baseline="one_ply"}' in exposed and "sluice_eval_best_update " in exposed
        evaluator_pids = descendants(learner.pid)
        assert evaluator_pids, "the evaluator child process is not running"
        learner.send_signal(signal.SIGTERM)
        assert learner.wait(timeout=30) == 128 + signal.SIGTERM, run.log("learner.log")
        assert actors.wait(timeout=30) == 0, run.log("actors.log")
        run.workers[learner.pid] = evaluator_pids
        run.assert_clean()
        lines = _lines(run.run_dir)
        assert lines and set(lines[0]["baselines"]) == {"random", "one_ply"}
        # the config's gate is on (evaluation.gate_games): the kept best is the newest line that became the best,
        # each best after the first passed the gate, and the kept best never got worse against the baselines
        kept = [line for line in lines if line["update"] == line["best_update"]]
        assert read_best(run.run_dir)["update"] == lines[-1]["best_update"] == kept[-1]["update"]
        assert "gate_passed" not in kept[0] and all(line["gate_passed"] for line in kept[1:])
        assert [line["mean_score"] for line in kept] == sorted(line["mean_score"] for line in kept)
        records = [json.loads(line) for line in (run.run_dir / "metrics.jsonl").read_text().splitlines()]
        assert any("eval_score_one_ply" in r for r in records)
        assert "exit code" not in run.log("learner.log")  # the evaluator never died while training went on
    finally:
        run.close()
