"""learner/monitor/progress.py: the console progress line (live, plain, quiet), with a fake clock; and --quiet/--plain."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from learner.monitor.progress import (ERASE_TO_END, MAX_LINE_CHARS, ProgressLine, ProgressMode, RateWindow, format_duration,
                              resolve_mode)

REPO = Path(__file__).resolve().parents[1]


class FakeClock:
    """Seconds that move only when a test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TtyStream(io.StringIO):
    """A StringIO that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def record(update: int, agent_steps: int, **extra) -> dict:
    return {"update": update, "agent_steps": agent_steps, "elapsed_s": 10.0 * update, "episode_return_mean": 21.5,
            "policy_lag_mean": 0.5, "policy_loss": 0.1, "value_loss": 0.2, "entropy": 0.3, "approx_kl": 0.0123,
            "clipfrac": 0.12, "explained_variance": 0.95, "actor_hosts": 2, "rows_dropped_stale": 0,
            "rows_dropped_future": 0, "messages_dropped": 0, **extra}


def make(mode: str, total: int = 1_000_000, stream: io.StringIO | None = None, **kwargs):
    clock = FakeClock()
    out = stream if stream is not None else io.StringIO()
    return ProgressLine(total_agent_steps=total, mode=mode, stream=out, clock=clock, **kwargs), clock, out


def test_resolve_mode_quiet_wins_then_plain_then_the_terminal():
    assert resolve_mode(True, True, TtyStream()) is ProgressMode.QUIET
    assert resolve_mode(False, True, TtyStream()) is ProgressMode.PLAIN
    assert resolve_mode(False, False, TtyStream()) is ProgressMode.LIVE
    assert resolve_mode(False, False, io.StringIO()) is ProgressMode.PLAIN
    line, _, _ = make("auto", stream=TtyStream())
    assert line.mode is ProgressMode.LIVE


def test_an_unknown_mode_names_the_allowed_values():
    with pytest.raises(ValueError, match="progress mode 'loud': allowed values are live, plain, quiet, auto"):
        make("loud")


def test_the_rate_is_over_the_window_not_the_last_lap():
    window = RateWindow(30.0)
    for t, steps in ((0, 0), (10, 1_000), (20, 3_000), (30, 6_000), (40, 10_000)):
        window.add(float(t), steps)
    # the window's start is 40 - 30 = 10: from (10, 1000) to (40, 10000); the last lap alone would be 400/s
    assert window.rate() == pytest.approx(9_000 / 30)
    assert [t for t, _ in window.points] == [10.0, 20.0, 30.0, 40.0]


def test_percent_eta_and_smoothed_sps_against_hand_computed_numbers():
    line, clock, out = make("plain", plain_interval_s=0.0)
    line.update(record(1, 100_000))
    first = out.getvalue().splitlines()[-1]
    assert "10.0% 100,000/1,000,000" in first and "eta --:--" in first and "-- sps" in first
    clock.now = 20.0
    line.update(record(2, 300_000))  # 200,000 steps in 20 s: 10,000/s; 700,000 left: 70 s
    second = out.getvalue().splitlines()[-1]
    assert second.startswith("upd 2  30.0% 300,000/1,000,000  0:00:20 eta 0:01:10  10,000 sps  ret 21.5  ")
    assert "hosts 2" in second and "lag 0.50" in second and "kl .012 clip .12 ev .95" in second
    clock.now = 40.0
    line.update(record(3, 400_000))
    third = out.getvalue().splitlines()[-1]
    # the newest point at or before 40 - 30 = 10 s is (0, 100,000): 300,000 steps in 40 s, 7,500/s (the last lap
    # alone would say 5,000/s); 600,000 left: 80 s
    assert "7,500 sps" in third and "eta 0:01:20" in third
    assert format_duration(3 * 3600 + 2 * 60 + 1) == "3:02:01" and format_duration(None) == "--:--"


def test_lines_stay_under_120_characters_with_huge_values():
    huge = record(10**9, 10**12 - 1, elapsed_s=1e9, episode_return_mean=-1.234567e12, policy_lag_mean=1.5e6,
                  approx_kl=1e9, clipfrac=123.0, explained_variance=-1e9, actor_hosts=10**7, win_rate=0.333333,
                  draw_rate=0.333333, loss_rate=0.333334)
    for mode in ("plain", "live"):
        for total in (10**12, 999_999_999_999_999_999, 7):
            line, clock, _ = make(mode, total=total)
            line.update(record(1, 10))
            clock.now = 1e-3
            line.update(huge)
            text = line.format_line(huge, clock.now)
            assert len(text) < 120 and len(text) <= MAX_LINE_CHARS, text
            assert text.split()[0].endswith("%") or text.startswith("upd "), text


def test_everyday_lines_show_every_part():
    line, clock, _ = make("plain")
    selfplay = record(41, 413_696, episode_return_mean=-0.12, win_rate=0.45, draw_rate=0.1, loss_rate=0.45,
                      explained_variance=-0.001)
    text = line.format_line(selfplay, clock.now)
    assert "ret -0.12 w/d/l 45/10/45%" in text and "upd 41" in text and text.endswith("kl .012 clip .12 ev .00")


def test_live_mode_rewrites_one_line_and_redraws_after_an_event():
    line, clock, out = make("live", stream=TtyStream())
    line.update(record(1, 1_000))
    assert out.getvalue().startswith("\r0.1% 1,000/1,000,000") and out.getvalue().endswith(ERASE_TO_END)
    clock.now = 0.1
    line.update(record(2, 2_000))  # within a quarter second of the last redraw: not drawn
    assert "2,000/" not in out.getvalue()
    clock.now = 0.3
    line.update(record(3, 3_000))
    assert out.getvalue().count("\r") == 2 and "\n" not in out.getvalue()
    mark = len(out.getvalue())
    line.event("host gpu-box-1234 joined (4 workers)")
    after = out.getvalue()[mark:]
    assert after.startswith("\r" + ERASE_TO_END + "host gpu-box-1234 joined (4 workers)\n\r0.3% 3,000/")
    line.close()
    assert out.getvalue().endswith(ERASE_TO_END + "\n")


def test_live_mode_shows_the_last_update_on_close():
    line, clock, out = make("live", stream=TtyStream())
    line.update(record(1, 1_000))
    clock.now = 0.1
    line.update(record(2, 2_000))
    assert "0.2% 2,000/" not in out.getvalue()
    line.close()
    last = out.getvalue().split("\r")[-1]
    assert last.startswith("0.2% 2,000/1,000,000") and last.endswith(ERASE_TO_END + "\n")


def test_a_live_line_leaves_out_its_least_important_parts_on_a_narrow_terminal(monkeypatch):
    class NarrowTerminal(TtyStream):
        def fileno(self) -> int:
            return 1

    monkeypatch.setattr("learner.monitor.progress.os.get_terminal_size", lambda fd: os.terminal_size((60, 24)))
    line, _, out = make("live", stream=NarrowTerminal())
    line.update(record(1, 1_000))
    shown = out.getvalue().removeprefix("\r").removesuffix(ERASE_TO_END)
    assert len(shown) <= 59 and shown.startswith("0.1% 1,000/1,000,000  0:00:10 eta --:--") and "lag" not in shown


def test_plain_mode_prints_the_first_then_one_per_interval_and_the_last():
    line, clock, out = make("plain", plain_interval_s=10.0)
    for update in range(1, 26):  # one update a second
        clock.now = float(update - 1)
        line.update(record(update, 1_000 * update))
    line.close()
    printed = [int(text.split()[1]) for text in out.getvalue().splitlines()]
    assert printed == [1, 11, 21, 25]
    assert "\r" not in out.getvalue() and ERASE_TO_END not in out.getvalue()


def test_plain_mode_does_not_print_the_last_update_twice():
    line, _, out = make("plain")
    line.update(record(1, 1_000))
    line.close()
    assert len(out.getvalue().splitlines()) == 1


def test_quiet_mode_prints_no_progress_but_prints_events():
    line, clock, out = make("quiet")
    line.update(record(1, 1_000))
    clock.now = 20.0
    line.update(record(2, 2_000))
    line.event("host gpu-box-1234 left (silent for 30 s)")
    line.close()
    assert out.getvalue() == "host gpu-box-1234 left (silent for 30 s)\n"


def test_drop_summaries_say_what_was_dropped_at_most_once_per_10_s():
    line, clock, out = make("quiet")
    line.update(record(1, 1_000, rows_dropped_stale=30, messages_dropped=2))
    for t, stale in ((2.0, 35), (5.0, 37)):  # within 10 s of the first summary: counted, not printed
        clock.now = t
        line.update(record(2, 2_000, rows_dropped_stale=stale, messages_dropped=2))
    clock.now = 10.0
    line.update(record(3, 3_000, rows_dropped_stale=37, rows_dropped_future=1, messages_dropped=2))
    clock.now = 25.0
    line.update(record(4, 4_000, rows_dropped_stale=37, rows_dropped_future=1, messages_dropped=2))  # no rise
    line.update(record(5, 5_000, rows_dropped_stale=38, rows_dropped_future=1, messages_dropped=2))
    line.close()
    assert out.getvalue().splitlines() == [
        "dropped 30 stale rows (older than max_policy_lag), 2 messages",
        "dropped 7 stale rows (older than max_policy_lag), 1 future row (newer than the learner's weights)",
        "dropped 1 stale row (older than max_policy_lag)"]


def test_a_drop_rise_left_unsaid_is_said_on_close():
    line, clock, out = make("plain", plain_interval_s=100.0)
    line.update(record(1, 1_000, messages_dropped=1))
    clock.now = 1.0
    line.update(record(2, 2_000, messages_dropped=4))
    line.close()
    said = [text for text in out.getvalue().splitlines() if text.startswith("dropped")]
    assert said == ["dropped 1 message", "dropped 3 messages"]


def test_late_rows_of_hosts_that_left_are_no_drop_to_report():
    """A host's normal stop leaves rows in flight that arrive after its BYE: counted under host_left, not said."""
    line, clock, out = make("quiet")
    line.update(record(1, 1_000, messages_dropped=5, messages_dropped_by_reason={"host_left": 5}))
    clock.now = 20.0
    line.update(record(2, 2_000, messages_dropped=7, messages_dropped_by_reason={"host_left": 5,
                                                                                "not_registered": 2}))
    line.close()
    assert out.getvalue().splitlines() == ["dropped 2 messages"]


@pytest.mark.parametrize("mode", ["live", "plain", "quiet"])
def test_none_and_missing_values_do_not_crash(mode):
    line, clock, out = make(mode, stream=TtyStream())
    line.update({"update": 1})
    clock.now = 1.0
    line.update({key: None for key in record(1, 1).keys()})
    clock.now = 2.0
    line.update(record(3, 3_000, episode_return_mean=float("nan"), explained_variance=None, win_rate=None,
                       draw_rate=0.5, loss_rate=None, actor_hosts=None, rows_dropped_stale=None))
    line.event("an event")
    line.close()
    assert "an event\n" in out.getvalue()
    if mode != "quiet":
        assert "ret --" in out.getvalue() and "--/1,000,000" in out.getvalue()


@pytest.mark.integration
def test_the_learner_refuses_quiet_with_plain():
    done = subprocess.run([sys.executable, "-m", "learner", "--quiet", "--plain"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    assert "python -m learner: error: argument --plain: not allowed with argument --quiet" in done.stderr


def test_a_coma_update_shows_its_critic_q_std_and_replay_fill():
    line, clock, _ = make("plain")
    coma = {key: value for key, value in record(9, 62_544).items()
            if key not in ("approx_kl", "clipfrac", "explained_variance", "policy_loss", "value_loss")}
    coma.update(critic_loss=0.1531, q_mean=-11.71, action_std=0.84, buffer_fill=0.18)
    text = line.format_line(coma, clock.now)
    assert text.endswith("critic .153 q -11.71 std .84 replay .18") and "kl" not in text, text
