"""Benchmark: the numba row assembler's bytes per second against a NumPy copy of the same bytes.

For each config (default: the gridworld's two configs) this builds a ``RowAssembler`` sized as an actor host
sizes it (``actors/host.py`` ``_start``: ``num_agents = workers x envs_per_worker x agents``, ``num_rows =
2 x num_agents + 2 x rows_per_message``) and drives it the way the host does: one ``add_staged`` call per
inference step for the agents of ``workers`` ready groups (``GroupStepper.act``), and after it the sender's
``pop_full`` / ``gather`` / ``release`` per ``rows_per_message`` block (``ActorHost._ship``).

Bytes counted per agent step: what lands in the row arrays, i.e. the per-step fields of
``protocol.rows.ROW_FIELDS`` (obs + action + action mask + logprob + value + reward + done + bootstrap: 747 bytes
for the gridworld, 6x11x11 uint8 obs, int32 action, no mask). The copy of a row's last step into the next row's
step 0 and the per-row fields (version, recurrent state) are not counted (the assembler is credited with fewer
bytes than it writes).

Against:
  * ``memcpy_per_call``: ``np.copyto`` of the same fields, same dtypes, same number of agents per call,
    into preallocated destinations that rotate over as many bytes as the row pool (so neither side writes
    into a cache-hot buffer). This is "a NumPy copy of the same bytes" with the same granularity, and
    ``assembler_over_memcpy`` (the headline, target 0.5) is measured against it.
  * ``memcpy_contiguous``: one big contiguous ``np.copyto`` of one horizon's worth of those bytes, the
    machine's copy ceiling; ``assembler_over_contiguous_memcpy`` is reported beside the headline.

``--profile`` adds: the numba kernel called directly (the wrapper's Python overhead is the difference), the
same kernel given the obs alone and every other per-step field alone (which part of the per-step work costs
what), and NumPy's copy of the obs alone into a contiguous destination and into scattered row slots.

The three are timed in interleaved rounds (the machine may be shared); the headline ratio is the median over
rounds, and the ratio of the totals is reported beside it.

Prints one JSON object per measurement and one ``assembler_copy`` headline record per config.
Usage: .venv/bin/python -m ops.bench.assembler_copy [--config configs/grid_3agents.yaml ...]
[--seconds 3.0] [--rounds 5] [--workers N] [--profile] [--set section.key=value ...]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from actors.assembler import RowAssembler
from actors.row_kernels import add_steps_kernel
from configs.loader import load_config
from configs.plan import make_plan
from envs.registry import env_spec
from envs.rows import message_sizing, row_layout, run_row_layout
from ops.benchlib import emit
from protocol.rows import ROW_FIELDS, RowLayout

TARGET = 0.5
SOURCES = 4  # distinct input batches, cycled (the host's inputs are fresh arrays every step)


def host_layout(config, workers: int | None) -> dict:
    """The assembler and per-call sizes an actor host with ``workers`` env workers would use."""
    trainer = config.trainer
    n = workers or trainer.num_workers
    plan = make_plan(trainer, num_agents=config.env.num_agents, num_workers=n)
    spec = env_spec(config.env)
    envs_per_group = plan.envs_per_worker // trainer.async_factor
    slots_per_group = envs_per_group * spec.num_agents
    total_agents = n * slots_per_group * trainer.async_factor
    rows_per_message = message_sizing(config, run_row_layout(config, spec, state_size=0)).rows
    return {"spec": spec, "workers": n, "total_agents": total_agents,
            "num_rows": 2 * total_agents + 2 * rows_per_message, "horizon": trainer.bptt_horizon + 1,
            "agents_per_call": n * slots_per_group, "groups": trainer.async_factor,
            "rows_per_message": rows_per_message}


def make_inputs(rows: RowLayout, n: int, seed: int) -> list[dict[str, np.ndarray]]:
    """``SOURCES`` batches of one step's per-step fields for ``n`` agents, in the rows' dtypes (small integers,
    N(0, 1) floats: the values do not matter to a copy)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(SOURCES):
        batch = {}
        for field in ROW_FIELDS:
            if not field.per_step:
                continue
            shape, dtype = (n, *rows.value_shape(field)), rows.dtype(field)
            values = rng.standard_normal(shape) if dtype.kind == "f" else rng.integers(0, 2, shape)
            batch[field.name] = values.astype(dtype)
        out.append(batch)
    return out


def step_bytes(inputs: dict[str, np.ndarray]) -> int:
    """Bytes of one add_steps call's payload (what lands in the row arrays)."""
    return sum(a.nbytes for a in inputs.values())


def rows_of(layout: dict) -> RowLayout:
    """The rows the host's assembler fills (feed-forward policy: no recurrent state)."""
    return row_layout(layout["spec"], horizon=layout["horizon"], state_size=0)


def new_assembler(layout: dict) -> RowAssembler:
    rows = rows_of(layout)
    return RowAssembler(num_agents=layout["total_agents"], num_rows=layout["num_rows"], horizon=rows.horizon,
                        obs_shape=rows.obs_shape, obs_dtype=rows.obs_dtype, state_size=rows.state_size,
                        action_shape=rows.action_shape, action_dtype=rows.action_dtype, mask_size=rows.mask_size)


def agent_batches(layout: dict) -> list[np.ndarray]:
    """The agent ids of successive add_steps calls: ``workers`` groups at a time, groups in turn."""
    spg = layout["agents_per_call"] // layout["workers"]
    per_worker = spg * layout["groups"]
    batches = []
    for g in range(layout["groups"]):
        batches.append(np.concatenate([np.arange(w * per_worker + g * spg, w * per_worker + (g + 1) * spg)
                                       for w in range(layout["workers"])]).astype(np.int64))
    return batches


class HostLoop:
    """add_staged per step (on inputs written into the staged arrays first, untimed, as GroupStepper.act writes
    them: the observations as it gathers the policy's batch), then ship full rows in rows_per_message blocks; each
    part timed on its own."""

    def __init__(self, layout: dict, inputs: list[dict]) -> None:
        self.layout, self.inputs = layout, inputs
        self.asm = new_assembler(layout)
        self.batches = agent_batches(layout)
        self.staged = self.asm.stage(max(len(batch) for batch in self.batches))
        self.step_bytes = step_bytes(inputs[0])
        self.calls = self.shipped_rows = self.shipped_bytes = 0
        self.add_s = self.ship_s = 0.0

    def run(self, seconds: float, min_calls: int = 0) -> None:
        asm, layout, rpm = self.asm, self.layout, self.layout["rows_per_message"]
        calls = 0
        started = time.perf_counter()
        while time.perf_counter() - started < seconds or calls < min_calls:
            src = self.inputs[self.calls % SOURCES]
            ids = self.batches[self.calls % len(self.batches)]
            for name, array in self.staged.arrays.items():
                array[:len(ids)] = src[name]
            t0 = time.perf_counter()
            asm.add_staged(self.staged, ids, 7)
            t1 = time.perf_counter()
            self.add_s += t1 - t0
            self.calls += 1
            calls += 1
            while asm.full_rows() >= rpm or not asm.can_accept(layout["agents_per_call"]):
                rows = asm.pop_full(rpm)
                arrays = asm.gather(rows)
                self.shipped_bytes += sum(a.nbytes for a in arrays.values())
                asm.release(rows)
                self.shipped_rows += len(rows)
            self.ship_s += time.perf_counter() - t1

    def reset_counters(self) -> None:
        self.calls = self.shipped_rows = self.shipped_bytes = 0
        self.add_s = self.ship_s = 0.0


class CopyPerCall:
    """np.copyto of each field per call, destinations rotating over as many bytes as the row pool."""

    def __init__(self, layout: dict, inputs: list[dict]) -> None:
        self.inputs = inputs
        n = len(inputs[0]["obs"])
        self.slots = max(layout["horizon"], layout["num_rows"] * layout["horizon"] // n)
        self.dst = {name: np.zeros((self.slots, *a.shape), dtype=a.dtype) for name, a in inputs[0].items()}
        self.step_bytes = step_bytes(inputs[0])
        self.calls, self.s = 0, 0.0

    def run(self, seconds: float) -> None:
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            src = self.inputs[self.calls % SOURCES]
            slot = self.calls % self.slots
            t0 = time.perf_counter()
            for name, a in src.items():
                np.copyto(self.dst[name][slot], a)
            self.s += time.perf_counter() - t0
            self.calls += 1


class CopyContiguous:
    """One big np.copyto of a horizon's worth of payload bytes (the copy ceiling)."""

    def __init__(self, layout: dict, inputs: list[dict]) -> None:
        self.nbytes = step_bytes(inputs[0]) * layout["total_agents"] // len(inputs[0]["obs"]) * layout["horizon"]
        self.src = np.random.default_rng(0).integers(0, 255, self.nbytes, dtype=np.uint8)
        self.dst = np.zeros(self.nbytes, dtype=np.uint8)
        self.copies, self.s = 0, 0.0

    def run(self, seconds: float) -> None:
        started = time.perf_counter()
        while time.perf_counter() - started < seconds or self.copies < 1:
            t0 = time.perf_counter()
            np.copyto(self.dst, self.src)
            self.s += time.perf_counter() - t0
            self.copies += 1


def _timed(fn, seconds: float, min_calls: int) -> tuple[int, float]:
    calls, total = 0, 0.0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds or calls < min_calls:
        t0 = time.perf_counter()
        fn(calls)
        total += time.perf_counter() - t0
        calls += 1
    return calls, total


def profile(layout: dict, inputs: list[dict], seconds: float) -> list[dict]:
    """The kernel alone (no wrapper) on every per-step field, on the obs alone and on the other per-step fields
    alone; rows recycled without timing."""
    spec = layout["spec"]
    batches = agent_batches(layout)
    horizon = layout["horizon"]
    n = layout["agents_per_call"]
    rpm = layout["rows_per_message"]
    nbytes = step_bytes(inputs[0])
    obs_bytes = inputs[0]["obs"].nbytes
    names = [f.name for f in ROW_FIELDS if f.per_step]
    records = []
    parts = (("kernel_direct", lambda name: True, nbytes, seconds),
             ("obs_only_kernel", lambda name: name == "obs", obs_bytes, seconds / 2),
             ("scalars_only_kernel", lambda name: name != "obs", nbytes - obs_bytes, seconds / 2))
    for variant, keep, part_bytes, part_seconds in parts:
        asm = new_assembler(layout)
        prepared = []
        for src in inputs:  # what add() hands the kernel, without its checks and conversions
            staged = asm.stage(n)
            for name, array in staged.arrays.items():
                if name in src:  # the per-row fields keep their poison (not timed apart)
                    array[:] = src[name]
            rows = [k for k, name in enumerate(staged.fields) if name not in names or keep(name)]
            prepared.append((staged.block, staged.table[rows]))

        def kernel_call(c: int, asm: RowAssembler = asm, prepared: list = prepared) -> None:
            block, table = prepared[c % SOURCES]
            asm._stamp += 1
            rc = add_steps_kernel(batches[c % len(batches)], np.int64(asm._stamp), block, table, asm._pool,
                                   asm.horizon, *asm._book)
            assert rc >= 0, rc

        kernel_call(0)
        calls, total = 0, 0.0
        started = time.perf_counter()
        while time.perf_counter() - started < part_seconds or calls < 2 * horizon * len(batches):
            t0 = time.perf_counter()
            kernel_call(calls)
            total += time.perf_counter() - t0
            calls += 1
            while asm.full_rows() >= rpm or not asm.can_accept(n):
                asm.release(asm.pop_full(rpm))
        records.append({"variant": variant, "calls": calls, "us_per_call": total / calls * 1e6,
                        "bytes_per_s": calls * part_bytes / total, "bytes_per_call": part_bytes})

    R, H = layout["num_rows"], horizon
    obs_pool = np.zeros((R, H, int(np.prod(spec.obs_shape))), dtype=spec.obs_dtype)
    ep_indices = np.arange(layout["total_agents"], dtype=np.int64) * 2 % R

    # NumPy's copy of the obs alone, per call (what the obs-only kernel competes with).
    dst = np.zeros((H, *inputs[0]["obs"].shape), dtype=spec.obs_dtype)
    fn = lambda c: np.copyto(dst[c % H], inputs[c % SOURCES]["obs"])  # noqa: E731
    calls, total = _timed(fn, seconds / 2, 2 * horizon)
    records.append({"variant": "obs_only_numpy_copyto", "calls": calls, "us_per_call": total / calls * 1e6,
                    "bytes_per_s": calls * obs_bytes / total, "bytes_per_call": obs_bytes})

    # NumPy's copy of the obs to the assembler's destinations: one agent per row, rows 47 KB apart.
    rows = ep_indices[batches[0]]
    fn = lambda c: obs_pool.__setitem__((rows, c % H), inputs[c % SOURCES]["obs"].reshape(n, -1))  # noqa: E731
    calls, total = _timed(fn, seconds / 2, 2 * horizon)
    records.append({"variant": "obs_only_numpy_scattered_rows", "calls": calls, "us_per_call": total / calls * 1e6,
                    "bytes_per_s": calls * obs_bytes / total, "bytes_per_call": obs_bytes})
    return records


def bench(config_path: str, overrides: list[str], workers: int | None, seconds: float, rounds: int,
          do_profile: bool) -> None:
    config = load_config(config_path, overrides)
    layout = host_layout(config, workers)
    spec = layout["spec"]
    inputs = make_inputs(rows_of(layout), layout["agents_per_call"], config.run.seed)
    per_call = step_bytes(inputs[0])
    common = {"config": config_path, "env": config.env.name, "obs_shape": list(spec.obs_shape),
              "obs_dtype": spec.obs_dtype, "total_agents": layout["total_agents"], "num_rows": layout["num_rows"],
              "horizon": layout["horizon"], "agents_per_call": layout["agents_per_call"],
              "bytes_per_agent_step": per_call // layout["agents_per_call"], "bytes_per_call": per_call}

    # Warm-up: numba compilation (or cache load), page faults of the row pool and destinations.
    host, per, big = HostLoop(layout, inputs), CopyPerCall(layout, inputs), CopyContiguous(layout, inputs)
    host.run(0.0, min_calls=2 * layout["horizon"] * layout["groups"])
    host.reset_counters()
    per.run(0.05)
    per.calls, per.s = 0, 0.0
    # Interleaved rounds: the machine is shared, so each round times all three back to back and the
    # headline ratio is the median over rounds (totals are reported as well).
    ratios, ceiling_ratios = [], []
    for _ in range(rounds):
        h0 = (host.add_s, host.calls)
        p0 = (per.s, per.calls)
        b0 = (big.s, big.copies)
        host.run(seconds / rounds)
        per.run(seconds / rounds)
        big.run(seconds / rounds / 2)
        asm_r = (host.calls - h0[1]) * host.step_bytes / (host.add_s - h0[0])
        per_r = (per.calls - p0[1]) * per.step_bytes / (per.s - p0[0])
        big_r = (big.copies - b0[1]) * big.nbytes / (big.s - b0[0])
        ratios.append(asm_r / per_r)
        ceiling_ratios.append(asm_r / big_r)

    asm_bps = host.calls * host.step_bytes / host.add_s
    emit({"benchmark": "assembler_add_steps", **common, "calls": host.calls,
          "us_per_call": round(host.add_s / host.calls * 1e6, 1),
          "ns_per_agent_step": round(host.add_s / (host.calls * layout["agents_per_call"]) * 1e9, 1),
          "bytes_per_s": round(asm_bps)})
    ship_bps = host.shipped_bytes / host.ship_s if host.ship_s else None
    messages = max(1, host.shipped_rows // layout["rows_per_message"])
    emit({"benchmark": "assembler_ship", **common, "rows_per_message": layout["rows_per_message"],
          "rows": host.shipped_rows, "s": round(host.ship_s, 4),
          "us_per_message": round(host.ship_s / messages * 1e6, 1),
          "bytes_per_s": round(ship_bps) if ship_bps else None,
          "note": "pop_full + gather (fancy-index copies of every field) + release, per rows_per_message block"})
    per_bps = per.calls * per.step_bytes / per.s
    emit({"benchmark": "memcpy_per_call", **common, "calls": per.calls,
          "us_per_call": round(per.s / per.calls * 1e6, 1), "bytes_per_s": round(per_bps),
          "note": "np.copyto of each field per call into preallocated arrays as large as the row pool"})
    big_bps = big.copies * big.nbytes / big.s
    emit({"benchmark": "memcpy_contiguous", **common, "copy_bytes": big.nbytes, "copies": big.copies,
          "bytes_per_s": round(big_bps), "note": "one np.copyto of a horizon of payload bytes (ceiling)"})

    if do_profile:
        for record in profile(layout, inputs, seconds):
            bps = record["bytes_per_s"]
            emit({"benchmark": "assembler_profile", **common, **record, "us_per_call": round(record["us_per_call"], 1),
                  "bytes_per_s": round(bps)})

    ratio = float(np.median(ratios))
    emit({"benchmark": "assembler_copy", "config": config_path, "assembler_bytes_per_s": round(asm_bps),
          "memcpy_bytes_per_s": round(per_bps), "assembler_over_memcpy": round(ratio, 3), "target": TARGET,
          "meets_target": ratio >= TARGET, "rounds": rounds,
          "assembler_over_memcpy_rounds": [round(r, 3) for r in ratios],
          "assembler_over_memcpy_totals": round(asm_bps / per_bps, 3),
          "contiguous_memcpy_bytes_per_s": round(big_bps),
          "assembler_over_contiguous_memcpy": round(float(np.median(ceiling_ratios)), 3),
          "ship_bytes_per_s": round(ship_bps) if ship_bps else None,
          "ship_over_contiguous_memcpy": round(ship_bps / big_bps, 3) if ship_bps else None,
          "agents_per_call": layout["agents_per_call"], "bytes_per_agent_step": common["bytes_per_agent_step"]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", action="append", default=None,
                        help="repeatable; default: configs/grid_3agents.yaml and configs/grid_24agents.yaml")
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    parser.add_argument("--workers", type=int, default=None,
                        help="env workers of the host (default trainer.num_workers)")
    parser.add_argument("--seconds", type=float, default=3.0,
                        help="timed seconds per measurement (split over the rounds)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (headline: median ratio)")
    parser.add_argument("--profile", action="store_true", help="also time the kernel alone and split by field")
    args = parser.parse_args()
    for path in args.config or ["configs/grid_3agents.yaml", "configs/grid_24agents.yaml"]:
        bench(path, args.overrides, args.workers, args.seconds, args.rounds, args.profile)


if __name__ == "__main__":
    main()
