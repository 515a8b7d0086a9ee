"""How rows travel (envs.rows.message_sizing): rows_per_message rows to a ROWS message, or as many small rows as fit in
network.message_bytes (up to one batch's segments and half the rows in flight), with a high-water mark that keeps
send_queue_messages x rows_per_message rows in flight; the learner's ingest takes exactly that many and refuses one
more."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import zmq

from configs.loader import load_config
from envs.base import EnvSpec
from envs.registry import env_spec
from envs.rows import message_sizing, row_layout, run_row_layout
from envs.spaces import ActionSpace
from learner.serve.ingest import open_ingest
from learner.serve.senders import Sender, SenderRegistry
from protocol import Message, MessageType, ProtocolError
from protocol.rows import RowLayout

TOKEN = "a" * 32

LAYOUTS = {
    "cartpole": row_layout(EnvSpec(num_agents=1, obs_shape=(4,), obs_dtype="float32",
                                   action=ActionSpace.discrete(2)), horizon=17, state_size=0),
    "image_masks_lstm": row_layout(EnvSpec(num_agents=2, obs_shape=(3, 5, 5), obs_dtype="uint8",
                                           action=ActionSpace.discrete(7), action_mask=True), horizon=9, state_size=32),
    "team_box": row_layout(EnvSpec(num_agents=3, obs_shape=(6,), obs_dtype="float32",
                                   action=ActionSpace.box([-1.0, -1.0], [1.0, 1.0]), state_size=12),
                           horizon=5, state_size=0, team=True),
}


@pytest.mark.parametrize("config_name, team", [("cartpole", False), ("coma_spread", True), ("token_cue", False)])
def test_a_runs_rows_have_its_horizon_and_team_rows_when_it_trains_coma(config_name, team):
    config = load_config(f"configs/{config_name}.yaml", ["trainer.bptt_horizon=8"])
    spec = env_spec(config.env)
    layout = run_row_layout(config, spec, state_size=5)
    assert layout == row_layout(spec, horizon=9, state_size=5, team=team)
    assert layout.team_size == (spec.num_agents if team else 0)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_row_nbytes_is_what_one_row_of_every_field_takes(name):
    layout: RowLayout = LAYOUTS[name]
    one, ten = layout.allocate(1), layout.allocate(10)
    assert layout.row_nbytes() == sum(array.nbytes for array in one.values())
    assert 10 * layout.row_nbytes() == sum(array.nbytes for array in ten.values())


def reference_sizing(*, rows_per_message: int, send_queue_messages: int, message_bytes: int, row_nbytes: int,
                     batch_size: int, bptt_horizon: int, max_message_bytes: int = 1 << 28) -> tuple[int, int]:
    """The rule written out again: (rows, hwm). Rows: the configured ones, unless more small rows fit the byte
    budget (never over half the largest message), at most one batch and half the rows the configured queue holds;
    hwm: that queue's rows in messages."""
    queue_rows = send_queue_messages * rows_per_message
    fit = min(message_bytes, max_message_bytes // 2) // row_nbytes
    rows = rows_per_message
    if fit > rows:
        rows = max(rows, min(fit, batch_size // bptt_horizon, queue_rows // 2))
    return rows, max(1, queue_rows // rows)


@pytest.mark.parametrize("overrides, expected", [
    ((), (32, 2)),  # configs/cartpole.yaml queues 2 x 32 rows: half of that is no more than 32
    (("network.send_queue_messages=32",), (512, 2)),  # 637-byte rows: 1 MiB holds 1646, one batch is 512
    (("network.send_queue_messages=8",), (128, 2)),  # half of 8 x 32 rows
    (("network.send_queue_messages=32", "network.message_bytes=0"), (32, 32)),  # off: the configured sizes
    (("network.send_queue_messages=32", "network.message_bytes=100"), (32, 32)),  # smaller than a row: the same
    (("network.send_queue_messages=32", "network.message_bytes=40000"), (62, 16)),  # 40000 // 637
    (("network.send_queue_messages=32", "network.rows_per_message=200"), (512, 12)),  # a floor below the fit
    (("network.send_queue_messages=32", "network.message_bytes=40000", "network.rows_per_message=200"),
     (200, 32)),  # the configured rows: a floor
    (("network.send_queue_messages=32", "trainer.batch_size=1024", "trainer.minibatch_size=512"),
     (64, 16)),  # one batch is 64 segments
    (("network.send_queue_messages=32", "network.max_message_bytes=65536"), (51, 20)),  # 32768 // 637
], ids=["default", "long_queue", "half_queue", "off", "below_a_row", "by_bytes", "floor_below", "floor", "one_batch",
        "largest_message"])
def test_cartpole_message_sizing(overrides, expected):
    config = load_config("configs/cartpole.yaml", overrides)
    layout = row_layout(env_spec(config.env), horizon=config.trainer.bptt_horizon + 1, state_size=0)
    assert layout.row_nbytes() == 637
    sizing = message_sizing(config, layout)
    assert (sizing.rows, sizing.hwm) == expected
    net, trainer = config.network, config.trainer
    assert expected == reference_sizing(rows_per_message=net.rows_per_message,
                                        send_queue_messages=net.send_queue_messages,
                                        message_bytes=net.message_bytes, row_nbytes=637,
                                        batch_size=trainer.batch_size, bptt_horizon=trainer.bptt_horizon,
                                        max_message_bytes=net.max_message_bytes)


def test_message_sizing_matches_the_reference_and_keeps_the_rows_in_flight_on_random_configs():
    rng = np.random.default_rng(7)
    for _ in range(60):
        horizon = int(rng.choice([4, 8, 16]))
        batch = horizon * int(rng.integers(1, 300))
        rpm, queue = int(rng.integers(1, 200)), int(rng.integers(1, 20))
        budget = int(rng.choice([0, rng.integers(1, 1 << 22)]))
        largest = int(rng.choice([1 << 28, rng.integers(1024, 1 << 20)]))
        config = load_config("configs/cartpole.yaml", (
            f"trainer.bptt_horizon={horizon}", f"trainer.batch_size={batch}", f"trainer.minibatch_size={batch}",
            f"network.rows_per_message={rpm}", f"network.message_bytes={budget}",
            f"network.send_queue_messages={queue}", f"network.max_message_bytes={largest}"))
        layout = row_layout(env_spec(config.env), horizon=horizon + 1, state_size=0)
        sizing = message_sizing(config, layout)
        assert (sizing.rows, sizing.hwm) == reference_sizing(
            rows_per_message=rpm, send_queue_messages=queue, message_bytes=budget, row_nbytes=layout.row_nbytes(),
            batch_size=batch, bptt_horizon=horizon, max_message_bytes=largest)
        assert sizing.rows >= rpm
        # a full queue never holds more rows than the configured one; bigger messages leave at least two in it
        assert sizing.hwm * sizing.rows <= max(queue * rpm, sizing.rows)
        assert sizing.rows == rpm or sizing.hwm >= 2


def test_the_learners_ingest_takes_the_shared_count_and_refuses_one_more():
    config = load_config("configs/cartpole.yaml", ("network.message_bytes=65536",
                                                   "network.send_queue_messages=16"))
    context, stop, registry = zmq.Context(), threading.Event(), SenderRegistry()
    registry.add(Sender(name="test", token=TOKEN, curve_key=None, num_envs=4, agent_slots=4))
    ingest = open_ingest(config, env_spec(config.env), context=context, endpoint="tcp://127.0.0.1:*", segments=512,
                         state_size=0, stop=stop, registry=registry, curve=None)
    try:
        assert ingest.rules.rows_per_message == 102  # 65536 // 637
        assert ingest.socket.getsockopt(zmq.RCVHWM) == 5  # 16 x 32 rows in flight
        with pytest.raises(ProtocolError, match=r"^num_rows 103 is more than the 102 rows a message may carry "
                                                r"\(network.rows_per_message, message_bytes\)$"):
            ingest._check(_rows_message(103), [])
        with pytest.raises(ProtocolError, match=r"^rows message is missing array\(s\) 'obs'"):  # 102 pass the count
            ingest._check(_rows_message(102), [])
    finally:
        ingest.socket.close(linger=0)
        context.term()


def _rows_message(num_rows: int) -> Message:
    """A ROWS header from the registered test host, with no arrays."""
    return Message(type=MessageType.ROWS, sender="test", version=0, fields={"num_rows": num_rows, "token": TOKEN},
                   arrays={})
