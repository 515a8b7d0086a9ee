"""ops.bench.host_stages's arithmetic: each stage's CPU beyond its children, per agent step, with the clock's own cost
per timed call taken out of every stage that times calls inside it; and its gather left out (``--without gather``).
(Its run inside the pipeline bench: tests/test_bench.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from actors.assembler import RowAssembler
from ops.bench.host_stages import STAGES, gather_without_copy, stage_without_obs, stages_for
from tests.test_assembler import small, step_one


def measured(seconds: dict[str, float], calls: dict[str, int], *, clock_s: float = 0.0, clock_inner_s: float = 0.0,
             steps: int = 1_000_000, process_s: float = 0.0) -> dict:
    return {"stages": {stage.name: [seconds.get(stage.name, 0.0), calls.get(stage.name, 0)] for stage in STAGES},
            "agent_steps": steps, "clock_s_per_call": clock_s, "clock_inner_s_per_call": clock_inner_s,
            "process_cpu_s": process_s}


def test_each_stage_is_what_it_spent_beyond_its_children() -> None:
    seconds = {"loop": 10.0, "poll": 1.0, "collect": 0.5, "act": 6.0, "act.step": 5.5, "act.scan": 1.0,
               "act.policy": 0.5, "act.wake": 0.75, "act.assembler": 2.0, "ship": 2.0, "ship.gather": 1.0,
               "ship.send": 0.25}
    calls = {name: 100 for name in seconds}
    figures = stages_for(measured(seconds, calls, steps=2_000_000, process_s=12.0))["host_stages_cpu_us_per_agent_step"]
    us = 1e6 / 2_000_000  # per second of CPU, per agent step
    assert figures == pytest.approx({
        "loop.rest": (10.0 - 1.0 - 0.5 - 6.0 - 2.0) * us, "poll": 1.0 * us, "collect": 0.5 * us,
        "act.rest": 0.5 * us, "act.step.rest": (5.5 - 1.0 - 0.5 - 0.75 - 2.0) * us, "act.scan": 1.0 * us,
        "act.policy": 0.5 * us, "act.wake": 0.75 * us, "act.assembler": 2.0 * us, "ship.rest": 0.75 * us,
        "ship.gather": 1.0 * us, "ship.send": 0.25 * us, "main_thread": 10.0 * us, "process": 12.0 * us}, abs=1e-3)
    assert "act.policy_model" not in figures  # a stage never called (the model policy, here) is left out
    parts = sum(value for name, value in figures.items() if name not in ("main_thread", "process"))
    assert parts == pytest.approx(10.0 * us, abs=2e-3)


def test_the_clocks_cost_is_taken_out_of_every_stage_that_times_calls_inside_it() -> None:
    clock_s, inner_s = 1e-6, 0.4e-6
    # true work: act.scan 1 s over 1000 calls, act.step 0.5 s of its own, act 0.25 s, loop 0.25 s; each timed call
    # measures inner_s of its own clock, and adds clock_s to the stage it is nested in (and every ancestor)
    calls = {"loop": 1, "act": 1000, "act.step": 1000, "act.scan": 1000}
    seconds = {"act.scan": 1.0 + 1000 * inner_s, "act.step": 1.5 + 1000 * (inner_s + clock_s),
               "act": 1.75 + 1000 * inner_s + 2000 * clock_s, "loop": 2.0 + inner_s + 3000 * clock_s}
    result = stages_for(measured(seconds, calls, clock_s=clock_s, clock_inner_s=inner_s, steps=1_000_000,
                                 process_s=3.0 + 3001 * clock_s))
    figures = result["host_stages_cpu_us_per_agent_step"]
    assert figures["act.scan"] == pytest.approx(1.0, abs=1e-3)
    assert figures["act.step.rest"] == pytest.approx(0.5, abs=1e-3)
    assert figures["act.rest"] == pytest.approx(0.25, abs=1e-3)
    assert figures["loop.rest"] == pytest.approx(0.25, abs=1e-3)
    assert figures["main_thread"] == pytest.approx(2.0, abs=1e-3)
    assert figures["process"] == pytest.approx(3.0, abs=1e-3)  # the other threads' second stays
    assert result["host_stages_clock_us_per_call"] == 1.0 and result["host_stages_agent_steps"] == 1_000_000


def test_every_stage_but_the_loop_has_a_parent_in_the_tree() -> None:
    names = [stage.name for stage in STAGES]
    assert len(set(names)) == len(names) and STAGES[0].parent is None
    for stage in STAGES[1:]:
        assert stage.parent in names[:names.index(stage.name)]
        assert callable(getattr(stage.owner, stage.method))


def test_the_gather_left_out_lays_a_slots_payload_out_without_copying_rows() -> None:
    """``--without gather``: the first message of a size is gathered for real; later ones into a slot keep the bytes
    the slot held (padding zeroed), in the same layout; a message that carries its rows is gathered as before."""
    asm = small(horizon=3, num_agents=2, num_rows=8)
    for t in range(6):
        step_one(asm, 0, float(t))
        step_one(asm, 1, 10.0 + t)
    rows = asm.pop_full(4)
    assert len(rows) == 4
    gather = gather_without_copy(RowAssembler.gather_packed)
    slot = np.full(asm.packed_bytes(2) + 64, 0xEE, dtype=np.uint8)
    first = gather(asm, rows[:2], into=slot)
    expected = asm.gather_packed(rows[:2])
    assert bytes(first.buffer) == bytes(expected.buffer)
    later = gather(asm, rows[2:], into=slot)
    assert later.layout is first.layout and bytes(later.buffer) == bytes(expected.buffer)  # rows[:2]'s, not copied
    fresh = gather(asm, rows[2:])
    assert bytes(fresh.buffer) == bytes(asm.gather_packed(rows[2:]).buffer)
    assert (slot[asm.packed_bytes(2):] == 0xEE).all()


def test_the_observations_left_out_of_the_add_keep_their_poison_and_the_rest_is_recorded() -> None:
    """``--without add_obs``: the staged steps' table has every field but the observations."""
    asm = small(horizon=3, num_agents=2, num_rows=8)
    staged = stage_without_obs(RowAssembler.stage)(asm, 2)
    assert "obs" not in staged.fields and len(staged.table) == len(staged.fields)
    staged.arrays["obs"][:2] = 7
    staged.arrays["rewards"][:2] = [1.5, 2.5]
    for _ in range(3):
        asm.add_staged(staged, np.array([0, 1]), 0)
    rows = asm.pop_full(2)
    packed = asm.gather_packed(rows)
    assert np.isnan(packed.arrays["obs"]).all()  # float observations' poison
    assert packed.arrays["rewards"][:, 1:].tolist() == [[1.5, 1.5], [2.5, 2.5]]
