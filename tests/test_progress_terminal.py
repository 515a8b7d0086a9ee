"""The live progress line in a real pseudo-terminal (issue 32), rendered by a terminal emulator (pyte): logging
records and events from other threads each land on a line of their own, never glued to the progress line; no
redraw after close, so the shell prompt starts on a fresh line; ``waiting for actor hosts`` once the last host has
gone; the opponent pool's size in self-play; console.log holds the lines without control codes."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import textwrap
from pathlib import Path

import pyte  # the test extra (pyproject.toml)
import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent('''
    import itertools, logging, sys, threading
    from pathlib import Path
    from learner.monitor.progress import ProgressLine
    from learner.run.run_record import write_run_record

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    ticks = itertools.count()
    progress = ProgressLine(total_agent_steps=100_000, mode="auto", stream=sys.stdout,
                            clock=lambda: 0.3 * next(ticks), plain_interval_s=30.0)
    assert progress.mode == "live"
    console = write_run_record(Path(sys.argv[1]), ["python", "-m", "learner"])
    console.hold_status_line(progress)
    progress.hosts(0)
    print("learner: listening")
    log = logging.getLogger("sluice.learner.control")

    def chatter():
        for i in range(20):
            log.warning("refused a control message from peer 006b8b45%02d (not_registered)", i)

    thread = threading.Thread(target=chatter)
    progress.event("actor host vm:1 joined with 1 workers")
    progress.hosts(1)
    thread.start()
    for update in range(1, 41):
        progress.update({"update": update, "agent_steps": 1000 * update, "episode_return_mean": 5.0,
                         "actor_hosts": 1, "pool_snapshots": 7, "win_rate": 0.5, "draw_rate": 0.1,
                         "loss_rate": 0.4})
    thread.join()
    progress.event("actor host vm:1 left")
    progress.hosts(0)
    progress.close()
    progress.event("learner: stopped (total_timesteps reached)")
    console.close()
''')


def run_in_a_terminal(tmp_path: Path) -> bytes:
    """Run CHILD with stdin, stdout and stderr on a pseudo-terminal; everything it wrote there."""
    main, child_end = pty.openpty()
    os.set_blocking(main, True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "120", "LINES": "50"}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path)], cwd=REPO, stdin=child_end,
                            stdout=child_end, stderr=child_end, env=env, start_new_session=True)
    os.close(child_end)
    output = b""
    try:
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: the child's end is closed
                break
            if not chunk:
                break
            output += chunk
    finally:
        os.close(main)
        assert proc.wait(timeout=60) == 0, output.decode(errors="replace")
    return output


def test_the_live_line_keeps_off_log_lines_and_ends_before_the_prompt(tmp_path):
    output = run_in_a_terminal(tmp_path)
    screen = pyte.Screen(120, 60)
    pyte.ByteStream(screen).feed(output.replace(b"\n", b"\r\n") if b"\r\n" not in output else output)
    lines = [line.rstrip() for line in screen.display]
    shown = [line for line in lines if line]
    logged = [line for line in shown if " WARNING refused a control message" in line]
    assert len(logged) == 20 and all(line.split(" ", 2)[2].startswith("sluice.learner.control WARNING refused")
                                     for line in logged)  # whole lines, nothing glued before or after
    progress = [line for line in shown if "% " in line and "/100,000" in line]
    assert len(progress) == 1, shown  # redrawn in place: one progress line on the screen
    assert progress[0].startswith("40.0% 40,000/100,000") and "pool 7" in progress[0]
    assert "w/d/l 50/10/40%" in progress[0] and "waiting for actor hosts" in progress[0]
    assert "hosts 1" not in progress[0]
    assert shown[:2] == ["learner: listening", "actor host vm:1 joined with 1 workers"]
    assert shown[-3:] == ["actor host vm:1 left", progress[0], "learner: stopped (total_timesteps reached)"]
    assert (screen.cursor.y, screen.cursor.x) == (lines.index(shown[-1]) + 1, 0)  # the prompt gets a line of its own
    copied = (tmp_path / "console.log").read_text()
    assert "\x1b" not in copied and "\r" not in copied
    copied_lines = copied.splitlines()
    assert [line for line in copied_lines if "WARNING refused" in line] == logged
    assert copied_lines[-1] == "learner: stopped (total_timesteps reached)" and copied_lines[-2] == progress[0]
    assert sum("/100,000" in line for line in copied_lines) < 40  # not every redraw
