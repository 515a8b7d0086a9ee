"""The learner's console progress: one short line a person can read, in one of three modes.

- ``live`` (stdout is a terminal): one line rewritten in place (``\\r`` and erase-to-end-of-line), at most
  ``LIVE_REDRAWS_PER_S`` redraws a second; an event clears it, prints its own line and redraws it. Whatever else
  the process prints (logging on stderr, ``print``) goes through the console wrapper of
  learner/run/run_record.py, which calls ``hide`` first and ``show`` again after a whole line. After
  ``close`` the line is never drawn again (events still print, each on its own line). With no actor host
  registered (``hosts(0)``) the line says ``waiting for actor hosts``.
- ``plain`` (a log file or a pipe): newline-terminated lines, the first update's, then at most one per
  ``plain_interval_s``, and the last update's on ``close()``; with the update number and kl/clip/ev.
- ``quiet``: no progress lines. Events still print, in every mode: they are rare and matter (a host joined or
  left, rows or messages dropped).

A line holds: percent of ``total_agent_steps`` and agent steps done/total, elapsed and ETA (h:mm:ss; the ETA
from the smoothed rate, ``--:--`` before there is one), agent steps per second over the last ``window_s``
seconds, the mean return (and win/draw/loss in self-play), the opponent pool's size (self-play), actor hosts and
policy lag. It is kept under ``MAX_LINE_CHARS`` (and the terminal's width in live mode) by leaving out the least
important parts.
When the record's cumulative drop counters rise, an event line says what was dropped since the last such
line, at most once per ``DROP_SUMMARY_INTERVAL_S``. metrics.jsonl and TensorBoard keep every figure.

``copy`` (set by the run's console.log, learner/run/run_record.py) receives the text a log file should keep:
every event and plain line, and in live mode the live line's text without control codes, the first one, then at
most one per ``plain_interval_s`` and the last one on ``close`` (not every redraw).
"""

from __future__ import annotations

import collections
import enum
import math
import numbers
import os
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from learner.serve.ingest_counters import HOST_LEFT

MAX_LINE_CHARS = 119
"""The longest progress line, in characters (under 120)."""

LIVE_REDRAWS_PER_S = 4.0
"""How often a live line is redrawn at most."""

DROP_SUMMARY_INTERVAL_S = 10.0
"""Seconds between two lines saying what was dropped, at least."""

ERASE_TO_END = "\x1b[K"
"""ANSI erase-to-end-of-line."""

WAITING_FOR_HOSTS = "waiting for actor hosts"
"""What the live line shows while no actor host is registered."""

DROP_COUNTERS = (("rows_dropped_stale", "stale rows (older than max_policy_lag)",
                  "stale row (older than max_policy_lag)"),
                 ("rows_dropped_future", "future rows (newer than the learner's weights)",
                  "future row (newer than the learner's weights)"),
                 ("messages_dropped", "messages", "message"))
"""The record's cumulative drop counters: key, plural and singular wording."""


class ProgressMode(enum.StrEnum):
    """How progress is shown."""

    LIVE = "live"
    PLAIN = "plain"
    QUIET = "quiet"
    AUTO = "auto"
    """live when the stream is a terminal, else plain (resolved when the ProgressLine is made)."""


def resolve_mode(quiet: bool, plain: bool, stream: TextIO) -> ProgressMode:
    """The mode the command line asks for: --quiet wins, then --plain, else live on a terminal and plain
    elsewhere."""
    if quiet:
        return ProgressMode.QUIET
    if plain:
        return ProgressMode.PLAIN
    isatty = getattr(stream, "isatty", None)
    return ProgressMode.LIVE if isatty is not None and isatty() else ProgressMode.PLAIN


class RateWindow:
    """Agent steps per second over the last ``window_s`` seconds of (time, agent steps) points: from the newest
    point at or before the window's start (so the span covers the whole window once there is that much
    history) to the newest point."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.points: collections.deque[tuple[float, int]] = collections.deque()

    def add(self, now: float, agent_steps: int) -> None:
        """One more point; points no longer needed for the window are forgotten."""
        self.points.append((now, agent_steps))
        while len(self.points) > 2 and self.points[1][0] <= now - self.window_s:
            self.points.popleft()

    def rate(self) -> float | None:
        """Steps per second over the window, None before two points a moment apart."""
        if len(self.points) < 2:
            return None
        (first_t, first_steps), (last_t, last_steps) = self.points[0], self.points[-1]
        return (last_steps - first_steps) / (last_t - first_t) if last_t > first_t else None


def format_count(value: float) -> str:
    """An integer count with thousands separators, or 3 significant digits and a unit from 100 million on."""
    if abs(value) < 1e8:
        return f"{value:,.0f}"
    for divisor, unit in ((1e6, "M"), (1e9, "G"), (1e12, "T"), (1e15, "P")):
        text = f"{value / divisor:.3g}"
        if "e" not in text:
            return text + unit
    return f"{value:.3g}"


def format_duration(seconds: float | None) -> str:
    """h:mm:ss; ``--:--`` when unknown, ``>999h`` beyond 999 hours."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "--:--"
    if seconds >= 1000 * 3600:
        return ">999h"
    whole = int(seconds)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def format_number(value: float, *, decimals: int, leading_zero: bool = True) -> str:
    """``decimals`` places (``.12`` for 0.12 without ``leading_zero``), 3 significant digits from 100,000 on."""
    if abs(value) >= 1e5:
        return f"{value:.3g}"
    text = f"{value:.{decimals}f}".removeprefix("-") if round(value, decimals) == 0 else f"{value:.{decimals}f}"
    if not leading_zero and text.lstrip("-").startswith("0."):
        text = text.replace("0.", ".", 1)
    return text


def _finite(record: dict[str, Any], key: str) -> float | None:
    """``record[key]`` as a finite number, None when absent, None or not a finite number."""
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        return None
    return float(value)


LOSS_FIELDS = (("approx_kl", "kl", 3), ("clipfrac", "clip", 2), ("explained_variance", "ev", 2),
               ("critic_loss", "critic", 3), ("q_mean", "q", 2), ("action_std", "std", 2), ("buffer_fill", "replay", 2))
"""The algorithm's health figures the line shows when an update reports them: (key, label, decimals); PPO's, then
COMA's."""


class ProgressLine:
    """The console progress of one learner run; ``update`` once per update, ``event`` for a line of its own,
    ``close`` after the last update. Safe to call from several threads (events may come from the control
    thread)."""

    def __init__(self, *, total_agent_steps: int, mode: str, stream: TextIO,
                 clock: Callable[[], float] = time.monotonic, window_s: float = 30.0,
                 plain_interval_s: float = 10.0) -> None:
        """``mode``: one of ProgressMode's values; ``clock``: seconds, for the rate and the rate limits."""
        try:
            resolved = ProgressMode(mode)
        except ValueError:
            allowed = ", ".join(m.value for m in ProgressMode)
            raise ValueError(f"progress mode {mode!r}: allowed values are {allowed}") from None
        self.mode = resolve_mode(False, False, stream) if resolved is ProgressMode.AUTO else resolved
        self.total_agent_steps = total_agent_steps
        self.stream = stream
        self.clock = clock
        self.plain_interval_s = plain_interval_s
        self.started = clock()
        self.rate = RateWindow(window_s)
        self.latest: dict[str, Any] | None = None
        self.latest_shown = True
        self.last_shown_at: float | None = None
        self.live_line_on_screen = False
        self.live_text: str | None = None
        """The text of the live line last drawn."""
        self.closed = False
        """``close`` was called: the live line is never drawn again."""
        self.hidden = False
        """Other output is on the terminal's last line (``hide`` until ``show``): the live line waits."""
        self.hosts_now: int | None = None
        """Actor hosts registered now (``hosts``), None before anyone said."""
        self.copy: Callable[[str], None] | None = None
        """Where the lines a log file keeps go (console.log), None: nowhere."""
        self.copied_text: str | None = None
        self.last_copied_at: float | None = None
        self.drops_reported = {key: 0 for key, _, _ in DROP_COUNTERS}
        self.drops_seen = dict(self.drops_reported)
        self.last_drop_summary_at: float | None = None
        self.lock = threading.RLock()

    def update(self, record: dict[str, Any]) -> None:
        """One update's metrics.jsonl record."""
        with self.lock:
            self._update(record)

    def _update(self, record: dict[str, Any]) -> None:
        now = self.clock()
        steps = _finite(record, "agent_steps")
        if steps is not None:
            self.rate.add(now, int(steps))
        self.latest, self.latest_shown = record, False
        self._note_drops(record, now, final=False)
        if self.closed:
            return
        if self.mode is ProgressMode.LIVE:
            if self.last_shown_at is None or now - self.last_shown_at >= 1.0 / LIVE_REDRAWS_PER_S:
                self._draw_live(now)
        elif self.mode is ProgressMode.PLAIN:
            if self.last_shown_at is None or now - self.last_shown_at >= self.plain_interval_s:
                self._print_plain(now)

    def event(self, text: str) -> None:
        """``text`` on a line of its own (in every mode, quiet included); a live line is redrawn below it (not
        after ``close``)."""
        with self.lock:
            if self.live_line_on_screen:
                self.stream.write("\r" + ERASE_TO_END)
            self.stream.write(text + "\n")
            self._copy(text)
            self.live_line_on_screen = False
            self._redraw()
            self.stream.flush()

    def hosts(self, count: int) -> None:
        """The actor hosts registered now (the control server's count, asked while the learner waits for rows):
        the live line shows it, and ``waiting for actor hosts`` while it is 0."""
        with self.lock:
            if count != self.hosts_now:
                self.hosts_now = count
                self._redraw()

    def hide(self) -> None:
        """Other output is about to be written to the terminal: clear the live line until ``show``."""
        with self.lock:
            self.hidden = True
            if self.live_line_on_screen:
                self.stream.write("\r" + ERASE_TO_END)
                self.stream.flush()
                self.live_line_on_screen = False

    def show(self) -> None:
        """The other output ended a line: draw the live line again (not after ``close``)."""
        with self.lock:
            self.hidden = False
            if not self.live_line_on_screen:
                self._redraw()

    def close(self) -> None:
        """Show the last update (if not shown yet) and what was dropped since the last summary; end the live
        line."""
        with self.lock:
            self._close()

    def _close(self) -> None:
        if self.closed:
            return
        now = self.clock()
        if self.latest is not None:
            self._note_drops(self.latest, now, final=True)
        if self.mode is ProgressMode.LIVE:
            if self.latest is not None and not self.latest_shown:
                self._draw_live(now)
            if self.live_line_on_screen:  # the last update's line stays; "waiting for actor hosts" goes
                self.stream.write("\n" if self.latest is not None else "\r" + ERASE_TO_END)
                self.live_line_on_screen = False
            if self.latest is not None:
                final = self.live_text if self.latest_shown else self.format_line(self.latest, now)
                if final is not None and final != self.copied_text:
                    self._copy(final)
        elif self.mode is ProgressMode.PLAIN and self.latest is not None and not self.latest_shown:
            self._print_plain(now)
        self.closed = True
        self.stream.flush()

    def format_line(self, record: dict[str, Any], now: float) -> str:
        """The progress line for ``record`` (with the update number and kl/clip/ev in plain mode)."""
        plain = self.mode is not ProgressMode.LIVE
        steps = _finite(record, "agent_steps")
        rate = self.rate.rate()
        elapsed = _finite(record, "elapsed_s")
        elapsed = now - self.started if elapsed is None else elapsed
        eta = None
        if steps is not None and rate is not None and rate > 0:
            eta = max(self.total_agent_steps - steps, 0) / rate
        # (priority, text): the lowest priorities are left out first when the line is too long
        parts = [(0, self._steps_text(steps)),
                 (1, f"{format_duration(elapsed)} eta {format_duration(eta)}"),
                 (2, f"{'--' if rate is None else format_count(rate)} sps"),
                 (3, self._return_text(record))]
        update = _finite(record, "update")
        if plain and update is not None:
            parts.insert(0, (4, f"upd {format_count(update)}"))
        pool = _finite(record, "pool_snapshots")
        if pool is not None:
            parts.append((8, f"pool {format_count(pool)}"))
        hosts = _finite(record, "actor_hosts") if plain or self.hosts_now is None else self.hosts_now
        if hosts == 0 and not plain:
            parts.insert(1, (1, WAITING_FOR_HOSTS))
        elif hosts is not None:
            parts.append((7, f"hosts {format_count(hosts)}"))
        lag = _finite(record, "policy_lag_mean")
        if lag is not None:
            parts.append((6, f"lag {format_number(lag, decimals=2)}"))
        if plain:
            parts.append((5, self._losses_text(record)))
        return self._fit([(priority, text) for priority, text in parts if text])

    def _fit(self, parts: list[tuple[int, str]]) -> str:
        """Join the parts, leaving out the least important until the line fits."""
        width = self._line_width()
        while True:
            line = "  ".join(text for _, text in parts)
            if len(line) <= width or len(parts) == 1:
                return line[:width]
            parts.remove(max(parts, key=lambda part: part[0]))

    def _steps_text(self, steps: float | None) -> str:
        total = format_count(self.total_agent_steps)
        if steps is None:
            return f"--/{total}"
        percent = 100.0 * steps / self.total_agent_steps if self.total_agent_steps > 0 else math.nan
        percent_text = "--%" if math.isnan(percent) else ">999%" if percent >= 1000 else f"{percent:.1f}%"
        return f"{percent_text} {format_count(steps)}/{total}"

    @staticmethod
    def _return_text(record: dict[str, Any]) -> str:
        mean = _finite(record, "episode_return_mean")
        text = "ret --" if mean is None else f"ret {format_number(mean, decimals=2 if abs(mean) < 10 else 1)}"
        rates = [_finite(record, key) for key in ("win_rate", "draw_rate", "loss_rate")]
        if all(rate is not None for rate in rates):
            text += " w/d/l " + "/".join(f"{100 * rate:.0f}" for rate in rates) + "%"
        return text

    @staticmethod
    def _losses_text(record: dict[str, Any]) -> str:
        shown = []
        for key, label, decimals in LOSS_FIELDS:
            value = _finite(record, key)
            if value is not None:
                shown.append(f"{label} {format_number(value, decimals=decimals, leading_zero=False)}")
        return " ".join(shown)

    def _live_text(self, now: float) -> str | None:
        """What the live line shows now: the latest update's line, ``waiting for actor hosts`` before the first
        update while none is registered, None before anything."""
        if self.latest is not None:
            return self.format_line(self.latest, now)
        return WAITING_FOR_HOSTS if self.hosts_now == 0 else None

    def _redraw(self) -> None:
        """Draw the live line again where one is due (live mode, not hidden, not closed)."""
        if self.mode is ProgressMode.LIVE and not self.hidden and not self.closed:
            self._draw_live(self.clock())

    def _draw_live(self, now: float) -> None:
        if self.hidden or self.closed:
            return
        text = self._live_text(now)
        if text is None:
            return
        self.stream.write("\r" + text + ERASE_TO_END)
        self.stream.flush()
        self.live_line_on_screen, self.live_text = True, text
        if self.latest is not None:
            self.latest_shown, self.last_shown_at = True, now
            if self.last_copied_at is None or now - self.last_copied_at >= self.plain_interval_s:
                self._copy(text)
                self.last_copied_at = now

    def _print_plain(self, now: float) -> None:
        assert self.latest is not None
        text = self.format_line(self.latest, now)
        self.stream.write(text + "\n")
        self.stream.flush()
        self._copy(text)
        self.latest_shown, self.last_shown_at = True, now

    def _copy(self, text: str) -> None:
        """``text`` as one line of the log file's copy (console.log), where there is one."""
        if self.copy is not None:
            self.copy(text + "\n")
            self.copied_text = text

    def _note_drops(self, record: dict[str, Any], now: float, *, final: bool) -> None:
        """Print what was dropped since the last summary when the counters rose, at most once per
        DROP_SUMMARY_INTERVAL_S (and at ``final``, whatever the time)."""
        for key, _, _ in DROP_COUNTERS:
            value = _finite(record, key)
            if value is not None:
                self.drops_seen[key] = int(value)
        if _finite(record, "messages_dropped") is not None:  # late rows of hosts that left are no refusal
            by_reason = record.get("messages_dropped_by_reason") or {}
            self.drops_seen["messages_dropped"] -= int(by_reason.get(HOST_LEFT, 0))
        rises = {key: self.drops_seen[key] - self.drops_reported[key] for key, _, _ in DROP_COUNTERS}
        if not any(rise > 0 for rise in rises.values()):
            return
        if not final and self.last_drop_summary_at is not None \
                and now - self.last_drop_summary_at < DROP_SUMMARY_INTERVAL_S:
            return
        said = [f"{rises[key]:,} {plural if rises[key] != 1 else singular}"
                for key, plural, singular in DROP_COUNTERS if rises[key] > 0]
        self.drops_reported = dict(self.drops_seen)
        self.last_drop_summary_at = now
        self.event("dropped " + ", ".join(said))

    def _line_width(self) -> int:
        """MAX_LINE_CHARS, or less in live mode on a terminal narrower than that (asked at every line: the
        window may be resized; a terminal that does not say its width counts as wide enough)."""
        if self.mode is not ProgressMode.LIVE:
            return MAX_LINE_CHARS
        try:
            columns = os.get_terminal_size(self.stream.fileno()).columns
        except (OSError, ValueError, AttributeError):
            return MAX_LINE_CHARS
        return MAX_LINE_CHARS if columns <= 0 else max(20, min(MAX_LINE_CHARS, columns - 1))
