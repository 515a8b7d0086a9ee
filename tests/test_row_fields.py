"""One table of row fields (protocol.rows.ROW_FIELDS) drives the assembler, the ROWS message, the ingest
buffers and the learner's batch: each has exactly the table's fields, in its dtypes, filled with its poison."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest
import torch
import zmq

from actors.assembler import RowAssembler
from envs.base import EnvSpec
from envs.spaces import ActionSpace
from envs.rows import row_layout
from learner.update.batch import (MINIBATCH_DERIVED, MINIBATCH_NAMES, NOT_IN_MINIBATCH, BatchBuffers, RowBatch,
                           minibatch_rows, to_batch)
from learner.serve.ingest import Ingest
from learner.ppo.losses import Minibatch
from learner.serve.senders import SenderRegistry
from protocol import ArraySpec, Limits, Message, MessageType, check_arrays
from protocol.rows import ROW_FIELD_NAMES, ROW_FIELDS, RowLayout

HORIZON, STATE = 5, 6
SPEC = EnvSpec(num_agents=1, obs_shape=(3, 5, 5), obs_dtype="uint8", action=ActionSpace.multi_discrete([3, 2]),
               action_mask=True)
LAYOUT = row_layout(SPEC, horizon=HORIZON, state_size=STATE)

WIRE = {
    "obs": ArraySpec(dtype="uint8", shape=(-1, HORIZON, 3, 5, 5)),
    "actions": ArraySpec(dtype="int32", shape=(-1, HORIZON, 2), allow_nonfinite=False),
    "action_masks": ArraySpec(dtype="uint8", shape=(-1, HORIZON, 5)),
    "logprobs": ArraySpec(dtype="float32", shape=(-1, HORIZON), allow_nonfinite=False),
    "values": ArraySpec(dtype="float32", shape=(-1, HORIZON), allow_nonfinite=False),
    "rewards": ArraySpec(dtype="float32", shape=(-1, HORIZON), allow_nonfinite=False),
    "dones": ArraySpec(dtype="uint8", shape=(-1, HORIZON)),
    "bootstrap": ArraySpec(dtype="float32", shape=(-1, HORIZON), allow_nonfinite=False),
    "versions": ArraySpec(dtype="int64", shape=(-1,)),
    "states": ArraySpec(dtype="float32", shape=(-1, STATE)),
    "global_state": ArraySpec(dtype="float32", shape=(-1, HORIZON, 0), allow_nonfinite=False),
    "truncated": ArraySpec(dtype="uint8", shape=(-1, HORIZON, 0)),
    "final_obs": ArraySpec(dtype="uint8", shape=(-1, HORIZON, 0)),
    "final_global_state": ArraySpec(dtype="float32", shape=(-1, HORIZON, 0), allow_nonfinite=False),
}
"""The ROWS message of this env as the protocol lays it out (names, order, dtypes, shapes); the team fields are
width 0 in per-agent rows."""

TEAM_SPEC = EnvSpec(num_agents=3, obs_shape=(4,), obs_dtype="float32", action=ActionSpace.box([0.0, 0.0], [1.0, 1.0]),
                    state_size=7)
TEAM_WIRE = {
    "obs": ArraySpec(dtype="float32", shape=(-1, HORIZON, 3, 4)),
    "actions": ArraySpec(dtype="float32", shape=(-1, HORIZON, 3, 2), allow_nonfinite=False),
    "action_masks": ArraySpec(dtype="uint8", shape=(-1, HORIZON, 0)),
    "logprobs": ArraySpec(dtype="float32", shape=(-1, HORIZON, 3), allow_nonfinite=False),
    "values": ArraySpec(dtype="float32", shape=(-1, HORIZON), allow_nonfinite=False),
    "rewards": ArraySpec(dtype="float32", shape=(-1, HORIZON, 3), allow_nonfinite=False),
    "dones": ArraySpec(dtype="uint8", shape=(-1, HORIZON)),
    "bootstrap": ArraySpec(dtype="float32", shape=(-1, HORIZON), allow_nonfinite=False),
    "versions": ArraySpec(dtype="int64", shape=(-1,)),
    "states": ArraySpec(dtype="float32", shape=(-1, 0)),
    "global_state": ArraySpec(dtype="float32", shape=(-1, HORIZON, 7), allow_nonfinite=False),
    "truncated": ArraySpec(dtype="uint8", shape=(-1, HORIZON)),
    "final_obs": ArraySpec(dtype="float32", shape=(-1, HORIZON, 3, 4)),
    "final_global_state": ArraySpec(dtype="float32", shape=(-1, HORIZON, 7), allow_nonfinite=False),
}
"""COMA's team rows of a 3-agent env: one row per env, every agent's values together."""


def check_table_arrays(arrays: dict[str, np.ndarray], rows: int, layout: RowLayout = LAYOUT) -> None:
    """Exactly the table's fields, in its order, with its dtypes and shapes."""
    assert tuple(arrays) == ROW_FIELD_NAMES
    for field in ROW_FIELDS:
        array = arrays[field.name]
        assert array.dtype == layout.dtype(field), field.name
        assert array.shape == (rows, *layout.row_shape(field)), field.name


def test_the_wire_layout_is_unchanged() -> None:
    specs = LAYOUT.specs()
    assert list(specs) == list(WIRE) and specs == WIRE


def test_team_rows_hold_every_agent_of_an_env() -> None:
    specs = row_layout(TEAM_SPEC, horizon=HORIZON, state_size=0, team=True).specs()
    assert list(specs) == list(TEAM_WIRE) and specs == TEAM_WIRE


def test_field_names_are_unique_and_shapes_name_layout_sizes() -> None:
    assert len(set(ROW_FIELD_NAMES)) == len(ROW_FIELDS)
    sizes = {f.name for f in dataclasses.fields(RowLayout)}
    for field in ROW_FIELDS:
        assert all(isinstance(d, int) or d in sizes or isinstance(getattr(RowLayout, d, None), property)
                   for d in field.shape), field.name
        assert field.dtype in sizes or np.dtype(field.dtype).name == field.dtype, field.name


def test_row_batch_has_the_table_fields() -> None:
    assert tuple(f.name for f in dataclasses.fields(RowBatch)) == ROW_FIELD_NAMES


def test_minibatch_has_the_rows_fields_it_takes_and_the_derived_ones() -> None:
    assert NOT_IN_MINIBATCH <= set(ROW_FIELD_NAMES) and set(MINIBATCH_NAMES) <= set(ROW_FIELD_NAMES)
    from_rows = {MINIBATCH_NAMES.get(name, name) for name in ROW_FIELD_NAMES if name not in NOT_IN_MINIBATCH}
    assert not from_rows & set(MINIBATCH_DERIVED)
    assert {f.name for f in dataclasses.fields(Minibatch)} == from_rows | set(MINIBATCH_DERIVED)


def test_fresh_buffers_hold_the_poison() -> None:
    float_obs = RowLayout(horizon=HORIZON, obs_shape=(2,), obs_dtype="float32", action_shape=(1,),
                          action_dtype="float32")
    for layout in (LAYOUT, float_obs):
        arrays = layout.allocate(3)
        check_table_arrays(arrays, 3, layout)
        for field in ROW_FIELDS:
            array = arrays[field.name]
            if array.dtype.kind == "f":
                assert np.isnan(array).all(), field.name
            else:
                assert (array == np.array(int(field.poison)).astype(array.dtype)).all(), field.name
    arrays = LAYOUT.allocate(1)
    assert (arrays["obs"] == 0xA5).all() and (arrays["actions"] == -1).all() and (arrays["versions"] == -1).all()
    assert (arrays["dones"] == 0xFF).all() and (arrays["action_masks"] == 0xA5).all()


def make_assembler() -> RowAssembler:
    return RowAssembler(num_agents=2, num_rows=4, horizon=HORIZON, obs_shape=SPEC.obs_shape,
                        obs_dtype=SPEC.obs_dtype, state_size=STATE, action_shape=SPEC.action.shape,
                        action_dtype=SPEC.action.dtype, mask_size=SPEC.mask_size)


def step_values(n: int, t: int) -> dict[str, np.ndarray]:
    """One step's values of every field ``add`` takes, from the table (``t`` marks the step)."""
    values = {}
    for field in ROW_FIELDS:
        if field.name != "versions":
            values[field.name] = np.full((n, *LAYOUT.value_shape(field)), t % 2, dtype=LAYOUT.dtype(field))
    return values


def test_assembler_buffers_and_rows_follow_the_table() -> None:
    asm = make_assembler()
    check_table_arrays(asm.arrays, 4)
    for t in range(HORIZON):
        asm.add(np.array([0, 1]), 3, **step_values(2, t))
    rows = asm.pop_full(2)
    gathered = asm.gather(rows)
    check_table_arrays(gathered, 2)
    check_arrays(Message(type=MessageType.ROWS, sender="t", version=3, fields={}, arrays=gathered), WIRE)
    assert (gathered["versions"] == 3).all() and (gathered["obs"][:, 1] == 1).all()


def test_assembler_rejects_unknown_and_missing_fields() -> None:
    asm = make_assembler()
    values = step_values(1, 0)
    with pytest.raises(ValueError, match="unknown row field"):
        asm.add(np.array([0]), 0, **values, team_reward=np.zeros((1, 3), np.float32))
    with pytest.raises(ValueError, match="unknown row field"):
        asm.add(np.array([0]), 0, **values, versions=np.zeros(1, np.int64))
    del values["action_masks"]
    with pytest.raises(ValueError, match="action_masks shape: missing"):
        asm.add(np.array([0]), 0, **values)
    values = step_values(1, 0)
    values["obs"] = values["obs"].astype(np.float32)  # observations keep their dtype's kind
    with pytest.raises(TypeError, match="obs"):
        asm.add(np.array([0]), 0, **values)
    values = step_values(1, 0)
    values["actions"] = values["actions"].astype(np.float64)  # cast, like any other field
    values["obs"] = values["obs"].astype(np.uint16)  # within the kind: cast
    asm.add(np.array([0]), 0, **values)
    assert asm.ep_lengths.tolist() == [1, 0]
    asm.discard_agents(np.array([0]))
    assert asm.ep_lengths.tolist() == [0, 0]


def test_ingest_buffers_follow_the_table() -> None:
    context = zmq.Context()
    ingest = Ingest(context=context, endpoint="tcp://127.0.0.1:*", segments=7, env=SPEC, horizon=HORIZON,
                    state_size=STATE, max_policy_lag=1, hwm=1, buffer_bytes=65536, limits=Limits(),
                    stop=threading.Event(), registry=SenderRegistry(), rows_per_message=8, max_abs_value=1e6)
    try:
        assert ingest.specs == WIRE
        for buffers in ingest.slots.buffers:
            check_table_arrays(buffers.arrays, 7)
            assert np.isnan(buffers.arrays["values"]).all() and (buffers.arrays["versions"] == -1).all()
    finally:
        ingest.socket.close(linger=0)
        context.term()


def test_to_batch_and_minibatch_rows() -> None:
    buffers = BatchBuffers.allocate(LAYOUT, 3)
    for name, array in buffers.arrays.items():
        array[...] = 1
    batch = to_batch(buffers, torch.device("cpu"))
    assert batch.dones.dtype == torch.float32 and batch.actions.dtype == torch.int64
    assert batch.obs.dtype == torch.uint8 and batch.versions.dtype == torch.int64
    for field in ROW_FIELDS:
        assert tuple(getattr(batch, field.name).shape) == (3, *LAYOUT.row_shape(field)), field.name
    rows = minibatch_rows(batch, HORIZON - 1)
    assert rows["obs"].shape[:2] == (3, HORIZON - 1) and rows["old_values"].shape == (3, HORIZON - 1)
    assert rows["states"].shape == (3, STATE)
