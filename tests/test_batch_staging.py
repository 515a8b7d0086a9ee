"""Host staging of a batch: BatchBuffers in pageable or pinned memory hold the row table's poison, and to_batch
gives the same RowBatch from either (pinned ones copied asynchronously to a GPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from envs.rows import row_layout
from learner.update.batch import BatchBuffers, to_batch
from protocol.rows import ROW_FIELDS
from tests.test_row_fields import HORIZON, LAYOUT, TEAM_SPEC

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def assert_same_arrays(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert list(got) == list(expected)
    for name, array in expected.items():
        assert got[name].dtype == array.dtype and got[name].shape == array.shape, name
        np.testing.assert_array_equal(got[name], array, err_msg=name)  # NaN poison compares equal to NaN


def fill(buffers: BatchBuffers, seed: int) -> None:
    """Every row written, with values that fit each field (actions inside nvec, flags 0/1)."""
    rng = np.random.default_rng(seed)
    for name, array in buffers.arrays.items():
        if name == "actions":
            array[...] = rng.integers(0, np.array(LAYOUT.action_nvec), size=array.shape)
        elif array.dtype.kind == "f":
            array[...] = rng.normal(size=array.shape)
        else:
            array[...] = rng.integers(0, 2, size=array.shape)


@pytest.mark.parametrize("layout", [LAYOUT, row_layout(TEAM_SPEC, horizon=HORIZON, state_size=0, team=True)])
def test_pageable_buffers_are_the_layouts_arrays(layout):
    buffers = BatchBuffers.allocate(layout, 3)
    assert not buffers.pinned and buffers.action_nvec == layout.action_nvec
    assert_same_arrays(buffers.arrays, layout.allocate(3))
    assert all(not torch.from_numpy(array).is_pinned() for array in buffers.arrays.values())


def test_to_batch_on_cpu_copies_every_field():
    buffers = BatchBuffers.allocate(LAYOUT, 3)
    fill(buffers, 0)
    batch = to_batch(buffers, torch.device("cpu"))
    for field in ROW_FIELDS:
        np.testing.assert_array_equal(getattr(batch, field.name).numpy(),
                                      buffers.arrays[field.name].astype(getattr(batch, field.name).numpy().dtype),
                                      err_msg=field.name)


@needs_cuda
def test_pinned_buffers_hold_the_poison_in_page_locked_memory():
    buffers = BatchBuffers.allocate(LAYOUT, 3, pinned=True)
    assert buffers.pinned
    assert_same_arrays(buffers.arrays, LAYOUT.allocate(3))
    for name, array in buffers.arrays.items():
        if array.size:
            assert torch.from_numpy(array).is_pinned(), name


@needs_cuda
def test_pinned_to_batch_matches_pageable_and_may_be_refilled_after():
    device = torch.device("cuda")
    pinned, pageable = BatchBuffers.allocate(LAYOUT, 64, pinned=True), BatchBuffers.allocate(LAYOUT, 64)
    fill(pinned, 1)
    for name, array in pinned.arrays.items():
        pageable.arrays[name][...] = array
    got = to_batch(pinned, device)
    for array in pinned.arrays.values():  # the ingest refills the buffer as soon as to_batch returns
        array[...] = 0
    expected = to_batch(pageable, torch.device("cpu"))
    for field in ROW_FIELDS:
        tensor = getattr(got, field.name)
        assert tensor.device.type == "cuda", field.name
        assert torch.equal(tensor.cpu(), getattr(expected, field.name)), field.name
