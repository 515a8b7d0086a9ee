"""console.log holds what the learner's terminal showed (issue 32): stdout and stderr (logging) in the order written,
the progress line's text rather than its redraws, no terminal control codes."""

from __future__ import annotations

import logging
import sys

import pytest
import zmq

from learner.run.run_record import begin_console_copy, plain_line, write_run_record
from protocol import Message, MessageType, encode
from tests.processes import Run, wait_for


def test_plain_line_drops_control_codes_and_keeps_what_follows_a_carriage_return():
    assert plain_line("\r12.0% 1,000/2,000\x1b[K") == "12.0% 1,000/2,000"
    assert plain_line("old text\r\x1b[Knew") == "new"
    assert plain_line("\x1b[31mred\x1b[0m and \x1b]0;title\x07plain\r") == "red and plain"


def test_the_copy_holds_stdout_stderr_and_logging_in_order_and_puts_them_back(tmp_path, capsys):
    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)  # as logging.basicConfig makes it, before the copy starts
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    root.addHandler(handler)
    try:
        early = begin_console_copy()  # before the run directory is known: kept in memory
        print("python -m learner: warning: an early warning", file=sys.stderr)
        copy = write_run_record(tmp_path, ["python", "-m", "learner"])
        assert copy is early
        print("out one")
        logging.getLogger("test.console").warning("a logged line")
        sys.stdout.write("two parts")
        sys.stdout.write(" of a line\n")
        print("\x1b[1mbold\x1b[0m on stderr", file=sys.stderr)
        copy.close()
        assert handler.stream is sys.stderr and not hasattr(sys.stdout, "copier")
    finally:
        root.removeHandler(handler)
    assert (tmp_path / "console.log").read_text().splitlines() == [
        "python -m learner: warning: an early warning", "out one", "WARNING a logged line", "two parts of a line",
        "bold on stderr"]
    captured = capsys.readouterr()
    assert captured.out == "out one\ntwo parts of a line\n"
    assert "WARNING a logged line" in captured.err and "an early warning" in captured.err


@pytest.mark.integration
def test_console_log_is_what_a_real_learner_printed_on_stdout_and_stderr(tmp_path):
    run = Run(tmp_path)
    try:
        learner = run.learner("--set", "trainer.target_episode_return=null", "--set", "trainer.total_timesteps=40000")
        actors = run.actors(1)
        assert wait_for(lambda: "joined with 1 workers" in run.log("learner.log"), 60), run.log("learner.log")
        context = zmq.Context()
        try:  # a stranger's heartbeat: a WARNING on the learner's stderr
            stranger = context.socket(zmq.DEALER)
            stranger.setsockopt(zmq.LINGER, 0)
            stranger.connect(f"tcp://127.0.0.1:{run.port}")
            stranger.send_multipart(encode(Message(type=MessageType.HEARTBEAT, sender="stranger", fields={})))
            assert stranger.poll(10_000)
        finally:
            context.destroy(linger=0)
        assert learner.wait(timeout=120) == 0, run.log("learner.log")
        assert actors.wait(timeout=30) == 0, run.log("actors.log")
    finally:
        run.close()
    shown = run.log("learner.log").splitlines()
    copied = (run.run_dir / "console.log").read_text().splitlines()
    assert copied == shown
    assert any(" WARNING refused a control message from peer " in line for line in copied)
    assert any(line.startswith("upd ") for line in copied) and copied[-1].startswith("learner: stopped")
