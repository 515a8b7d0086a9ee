"""Env failures by type: the worker wraps an env's own exception in EnvRaised (and passes EnvError through as it
is), its report names the original type and the user's file and line, and the learner prints each distinct
report an actor host's heartbeat carries once."""

from __future__ import annotations

import logging
import threading
import traceback

import pytest
import zmq

from actors.env_failures import EnvErrorReport
from actors.worker import _call
from configs.schema import TrainerSection
from envs.errors import EnvConfigError, EnvRaised
from learner.serve.control import ControlServer
from learner.serve.host_sizing import HostSizing
from learner.serve.senders import SenderRegistry
from protocol import Limits, Message, MessageType, decode, encode


REGISTRATION = {"config": {}, "data_endpoint": "tcp://127.0.0.1:1", "weights_endpoint": "tcp://127.0.0.1:2",
                "run_id": "run"}


class Broken:
    """An env whose step raises ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def step(self, buffers) -> None:
        raise self.error


def test_an_env_error_passes_as_it_is_and_anything_else_becomes_env_raised() -> None:
    config_error = EnvConfigError("step() returned 4 values")
    with pytest.raises(EnvConfigError) as caught:
        _call(Broken(config_error), "step", None, label="mine")
    assert caught.value is config_error
    with pytest.raises(EnvRaised, match=r"env 'mine' raised in step\(\): KeyError\('x'\)") as caught:
        _call(Broken(KeyError("x")), "step", None, label="mine")
    assert isinstance(caught.value.__cause__, KeyError)


def test_a_report_names_the_original_type_and_innermost_frame() -> None:
    try:
        try:
            Broken(ZeroDivisionError("division by zero")).step(None)
        except ZeroDivisionError as exc:
            raise EnvRaised("env 'mine' raised in step(): ZeroDivisionError('division by zero')") from exc
    except EnvRaised as exc:
        report = EnvErrorReport.from_exception(exc)
        innermost = traceback.extract_tb(exc.__cause__.__traceback__)[-1]
    assert report.error_type == "ZeroDivisionError"
    assert report.location == f"{__file__}:{innermost.lineno}" and innermost.name == "step"
    assert report.message == "env 'mine' raised in step(): ZeroDivisionError('division by zero')"
    assert EnvErrorReport.from_bytes(report.to_bytes()) == report
    assert report.within("env worker 1").text() == (f"env worker 1: {report.message} (ZeroDivisionError at "
                                                    f"{report.location})")
    assert EnvErrorReport.from_exception(EnvConfigError("x" * 5000)).message == "x" * 2000


def test_the_learner_prints_each_distinct_env_error_once(caplog) -> None:
    context = zmq.Context()
    stop = threading.Event()
    server = ControlServer(context=context, endpoint="tcp://127.0.0.1:*", registration=REGISTRATION,
                           peer_timeout_s=60, limits=Limits(), stop=stop, registry=SenderRegistry(),
                           sizing=HostSizing(trainer=TrainerSection(), num_agents=1))
    address = server.socket.getsockopt(zmq.LAST_ENDPOINT).decode()
    first = {"type": "RuntimeError", "message": "env 'mine' raised in step(): boom", "where": "/src/env.py:12"}
    second = {**first, "where": "/src/env.py:40"}
    host = context.socket(zmq.DEALER)
    caplog.set_level(logging.WARNING, logger="sluice.learner.control")
    server.start()
    try:
        host.connect(address)
        for type_, fields in [(MessageType.REGISTER, {"host": "h", "num_workers": 1}),
                              (MessageType.HEARTBEAT, {}), (MessageType.HEARTBEAT, {"env_error": first}),
                              (MessageType.HEARTBEAT, {"env_error": first}),
                              (MessageType.HEARTBEAT, {"env_error": second})]:
            host.send_multipart(encode(Message(type=type_, sender="h", fields=fields)))
            assert host.poll(5000)
            assert decode(host.recv_multipart()).type is not MessageType.ERROR
    finally:
        stop.set()
        server.join(timeout=5)
        host.close(linger=0)
        context.term()
    printed = [r.getMessage() for r in caplog.records if "env error" in r.getMessage()]
    assert printed == ["actor host h: env error RuntimeError at /src/env.py:12: env 'mine' raised in step(): boom",
                       "actor host h: env error RuntimeError at /src/env.py:40: env 'mine' raised in step(): boom"]
