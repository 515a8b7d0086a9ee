"""Built-in multi-agent gridworld: collect resources, carry them to a converter, get +1 per resource.

Every env is a square map of ``map_size x map_size`` walkable interior cells surrounded by walls (the array
carries a wall margin wide enough that an observation window never leaves it, so the kernels need no bounds
checks). A fresh map holds ``num_walls`` single interior wall cells, ``num_resources`` resource tiles,
``num_converters`` converter tiles and the ``num_agents`` agents, all on distinct random cells (walls are not
checked for connectivity). Default ``map_size`` is ``max(15, round(5 * sqrt(num_agents)))``: 15 for 3 agents,
24 for 24 agents, so the agent density stays moderate as the agent count grows.

Agents face north, east, south or west (0..3). Actions: 0 noop, 1 move forward (only onto an empty cell with
no agent), 2 turn left, 3 turn right, 4 use the tile in front: a resource is collected into the inventory when
it holds fewer than ``inventory_cap`` items (the tile is then depleted), a converter turns the whole inventory
into reward (+1 per item) and empties it. Every other transition gives reward 0. Agents of one env act in
index order within a step. A resource collected on step ``t`` shows again in the observation after step
``t + regrow_steps`` and can be collected from step ``t + regrow_steps + 1``.

Observation of an agent: ``[C, obs_height, obs_width]`` uint8, egocentric and rotated so that the agent always
faces "up" (row 0 is ahead, column ``obs_width - 1`` is to its right); the agent sits at row
``obs_height // 2``, column ``obs_width // 2``. Channels (255 = present):
0 wall (also everything outside the map), 1 resource, 2 converter, 3 another agent, 4 inventory of the agent
on that cell (its own at the centre; ``255 * inv // inventory_cap``), 5 depleted resource tile (regrowing).

Episode statistics (``EPISODE_STATS``, per agent, over its episode): ``items_collected``, the resources it
collected into its inventory, and ``items_converted``, the items it turned into reward at a converter. The
latter equals the agent's episode return; items still carried when the episode ends are collected but not
converted, so ``items_collected >= items_converted`` (unless ``set_map`` hands an agent a starting inventory).

Episodes end only by truncation after ``max_steps`` steps, for all agents of an env together; the env is then
re-generated from its own random stream (per-env 64-bit LCG states drawn from ``reset``'s seed), so a run is a
deterministic function of the reset seed and the actions. Agent slot of agent ``a`` of env ``e``:
``e * num_agents + a``.

``stagger_start: 1`` (default 0) staggers the envs in time: ``reset`` starts each env's step counter at a
uniform random step in ``[0, max_steps)`` from the env's own stream, so its first episode is truncated early
(its ``episode_length`` says how many steps it really had) and, from then on, episode ends are spread evenly
over time instead of arriving for every env at once every ``max_steps`` steps (Sample Factory's
decorrelation of envs, done inside the env). Later episodes all have ``max_steps`` steps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numba import njit

from envs.base import EnvSpec, StepBuffers
from envs.spaces import ActionSpace
from envs.errors import EnvConfigError

EMPTY, WALL, RESOURCE, CONVERTER, DEPLETED = 0, 1, 2, 3, 4
NUM_CHANNELS = 6
NUM_ACTIONS = 5
NOOP, FORWARD, LEFT, RIGHT, USE = 0, 1, 2, 3, 4
EPISODE_STATS = ("items_collected", "items_converted")
"""Named per-agent episode statistics, in the order of ``StepBuffers.episode_stats``' columns."""
DEFAULT_MAX_STEPS = 1000
"""Used when ``max_steps <= 0``."""
GRID_KWARGS = ("map_size", "num_walls", "num_resources", "num_converters", "regrow_steps", "inventory_cap",
               "stagger_start")
"""The env.kwargs keys gridworld accepts."""

# Direction vectors for orientations north, east, south, west.
_DY = np.array([-1, 0, 1, 0], dtype=np.int64)
_DX = np.array([0, 1, 0, -1], dtype=np.int64)


def default_map_size(num_agents: int) -> int:
    """Interior side of the map when env.kwargs has no 'map_size'."""
    return max(15, round(5 * math.sqrt(num_agents)))


def grid_settings(kwargs: Mapping[str, Any], num_agents: int) -> dict[str, int]:
    """The validated map settings from env.kwargs with their defaults (ValueError naming bad/unknown keys)."""
    unknown = sorted(str(k) for k in kwargs if k not in GRID_KWARGS)
    if unknown:
        allowed = ", ".join(repr(k) for k in GRID_KWARGS)
        raise EnvConfigError(f"env.kwargs for env 'gridworld' has unknown keys {unknown}; allowed keys: {allowed}")
    for key, value in kwargs.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise EnvConfigError(f"env.kwargs.{key} for env 'gridworld' must be an integer, got {value!r}")
    if num_agents < 1:
        raise EnvConfigError(f"gridworld needs num_agents >= 1, got {num_agents}")
    side = int(kwargs.get("map_size", default_map_size(num_agents)))
    area = side * side
    settings = {
        "map_size": side,
        "num_walls": int(kwargs.get("num_walls", area // 20)),
        "num_resources": int(kwargs.get("num_resources", area // 10)),
        "num_converters": int(kwargs.get("num_converters", max(1, num_agents // 8))),
        "regrow_steps": int(kwargs.get("regrow_steps", 50)),
        "inventory_cap": int(kwargs.get("inventory_cap", 5)),
        "stagger_start": int(kwargs.get("stagger_start", 0)),
    }
    minimum = {"map_size": 3, "num_walls": 0, "num_resources": 0, "num_converters": 0, "regrow_steps": 1,
               "inventory_cap": 1}
    for key, low in minimum.items():
        if settings[key] < low:
            raise EnvConfigError(f"env.kwargs.{key} for env 'gridworld' must be >= {low}, got {settings[key]}")
    if settings["stagger_start"] not in (0, 1):
        raise EnvConfigError(f"env.kwargs.stagger_start for env 'gridworld' must be 0 or 1, got "
                             f"{settings['stagger_start']}")
    if settings["inventory_cap"] > 255:
        raise EnvConfigError(f"env.kwargs.inventory_cap for env 'gridworld' must be <= 255, got "
                         f"{settings['inventory_cap']}")
    used = settings["num_walls"] + settings["num_resources"] + settings["num_converters"] + num_agents
    if used > (area * 3) // 4:
        raise EnvConfigError(
            f"gridworld map too full: {settings['num_walls']} walls + {settings['num_resources']} resources + "
            f"{settings['num_converters']} converters + {num_agents} agents = {used} cells > 3/4 of the "
            f"{side}x{side} = {area} interior cells; raise env.kwargs.map_size or lower the counts")
    return settings


@njit(cache=True)
def _rand(rng: np.ndarray, e: int, n: int) -> int:
    """Uniform integer in [0, n) from env ``e``'s LCG state (Knuth's MMIX constants, top 31 bits)."""
    s = rng[e] * 6364136223846793005 + 1442695040888963407
    rng[e] = s
    return ((s >> 33) & 0x7FFFFFFF) % n


@njit(cache=True)
def _free_cell(tiles, amap, rng, e, margin, side):
    """A random interior cell with no tile and no agent (rejection sampling; the map is at most 3/4 full)."""
    while True:
        y = margin + _rand(rng, e, side)
        x = margin + _rand(rng, e, side)
        if tiles[e, y, x] == EMPTY and amap[e, y, x] < 0:
            return y, x


@njit(cache=True)
def _generate(e, tiles, timers, amap, pos, orient, inv, rng, margin, side, n_walls, n_res, n_conv):
    """Draw a fresh map for env ``e`` from its random stream."""
    for y in range(margin, margin + side):
        for x in range(margin, margin + side):
            tiles[e, y, x] = EMPTY
            timers[e, y, x] = 0
            amap[e, y, x] = -1
    for _ in range(n_walls):
        y, x = _free_cell(tiles, amap, rng, e, margin, side)
        tiles[e, y, x] = WALL
    for _ in range(n_res):
        y, x = _free_cell(tiles, amap, rng, e, margin, side)
        tiles[e, y, x] = RESOURCE
    for _ in range(n_conv):
        y, x = _free_cell(tiles, amap, rng, e, margin, side)
        tiles[e, y, x] = CONVERTER
    for a in range(pos.shape[1]):
        y, x = _free_cell(tiles, amap, rng, e, margin, side)
        amap[e, y, x] = a
        pos[e, a, 0] = y
        pos[e, a, 1] = x
        orient[e, a] = _rand(rng, e, 4)
        inv[e, a] = 0


@njit(cache=True)
def _render(e, a, tiles, amap, pos, orient, inv, cap, out, slot):
    """Write agent ``a`` of env ``e``'s rotated egocentric window into ``out[slot]``."""
    h = out.shape[2]
    w = out.shape[3]
    for c in range(out.shape[1]):
        for r in range(h):
            for col in range(w):
                out[slot, c, r, col] = 0
    y0 = pos[e, a, 0]
    x0 = pos[e, a, 1]
    o = orient[e, a]
    # world = (y0 + ay*dr + by*dc, x0 + ax*dr + bx*dc) for dr = r - h//2 (negative: ahead), dc = col - w//2.
    if o == 0:
        ay, by, ax, bx = 1, 0, 0, 1
    elif o == 1:
        ay, by, ax, bx = 0, 1, -1, 0
    elif o == 2:
        ay, by, ax, bx = -1, 0, 0, -1
    else:
        ay, by, ax, bx = 0, -1, 1, 0
    ch = h // 2
    cw = w // 2
    for r in range(h):
        dr = r - ch
        for col in range(w):
            dc = col - cw
            y = y0 + ay * dr + by * dc
            x = x0 + ax * dr + bx * dc
            t = tiles[e, y, x]
            if t == WALL:
                out[slot, 0, r, col] = 255
            elif t == RESOURCE:
                out[slot, 1, r, col] = 255
            elif t == CONVERTER:
                out[slot, 2, r, col] = 255
            elif t == DEPLETED:
                out[slot, 5, r, col] = 255
            other = amap[e, y, x]
            if other >= 0:
                if other != a:
                    out[slot, 3, r, col] = 255
                out[slot, 4, r, col] = (255 * inv[e, other]) // cap


@njit(cache=True)
def _render_env(e, tiles, amap, pos, orient, inv, cap, out):
    n = pos.shape[1]
    for a in range(n):
        _render(e, a, tiles, amap, pos, orient, inv, cap, out, e * n + a)


@njit(cache=True)
def _reset_kernel(tiles, timers, amap, pos, orient, inv, depleted, steps, returns, collected, converted, rng,
                  margin, side, n_walls, n_res, n_conv, cap, obs, starts, stagger, max_steps):
    for e in range(tiles.shape[0]):
        _generate(e, tiles, timers, amap, pos, orient, inv, rng, margin, side, n_walls, n_res, n_conv)
        depleted[e] = 0
        steps[e] = _rand(rng, e, max_steps) if stagger else 0
        starts[e] = steps[e]
        for a in range(pos.shape[1]):
            returns[e, a] = 0.0
            collected[e, a] = 0
            converted[e, a] = 0
        _render_env(e, tiles, amap, pos, orient, inv, cap, obs)


@njit(cache=True)
def _step_kernel(tiles, timers, amap, pos, orient, inv, depleted, steps, returns, collected, converted, rng,
                 margin, side, n_walls, n_res, n_conv, cap, regrow, max_steps, dys, dxs,
                 actions, obs, rewards, terminated, truncated, final_obs, episode_done, episode_return,
                 episode_length, episode_stats, starts) -> int:
    """Step every env once; returns 0, or ``-1 - i`` if ``actions[i]`` is out of range (nothing stepped)."""
    num_envs = tiles.shape[0]
    n = pos.shape[1]
    for i in range(num_envs * n):
        if actions[i] < 0 or actions[i] >= NUM_ACTIONS:
            return -1 - i
    for e in range(num_envs):
        for a in range(n):
            s = e * n + a
            act = actions[s]
            reward = 0.0
            if act == FORWARD:
                y = pos[e, a, 0] + dys[orient[e, a]]
                x = pos[e, a, 1] + dxs[orient[e, a]]
                if tiles[e, y, x] == EMPTY and amap[e, y, x] < 0:
                    amap[e, pos[e, a, 0], pos[e, a, 1]] = -1
                    amap[e, y, x] = a
                    pos[e, a, 0] = y
                    pos[e, a, 1] = x
            elif act == LEFT:
                orient[e, a] = (orient[e, a] + 3) % 4
            elif act == RIGHT:
                orient[e, a] = (orient[e, a] + 1) % 4
            elif act == USE:
                y = pos[e, a, 0] + dys[orient[e, a]]
                x = pos[e, a, 1] + dxs[orient[e, a]]
                t = tiles[e, y, x]
                if t == RESOURCE and inv[e, a] < cap:
                    inv[e, a] += 1
                    collected[e, a] += 1
                    tiles[e, y, x] = DEPLETED
                    timers[e, y, x] = regrow + 1  # the end-of-step pass below takes one off at once
                    depleted[e] += 1
                elif t == CONVERTER and inv[e, a] > 0:
                    reward = float(inv[e, a])
                    converted[e, a] += inv[e, a]
                    inv[e, a] = 0
            rewards[s] = reward
            returns[e, a] += reward
            terminated[s] = False
        if depleted[e] > 0:
            for y in range(margin, margin + side):
                for x in range(margin, margin + side):
                    if tiles[e, y, x] == DEPLETED:
                        timers[e, y, x] -= 1
                        if timers[e, y, x] <= 0:
                            tiles[e, y, x] = RESOURCE
                            depleted[e] -= 1
        steps[e] += 1
        if steps[e] >= max_steps:
            _render_env(e, tiles, amap, pos, orient, inv, cap, final_obs)
            for a in range(n):
                s = e * n + a
                truncated[s] = True
                episode_done[s] = True
                episode_return[s] = returns[e, a]
                episode_length[s] = steps[e] - starts[e]
                episode_stats[s, 0] = collected[e, a]
                episode_stats[s, 1] = converted[e, a]
                returns[e, a] = 0.0
                collected[e, a] = 0
                converted[e, a] = 0
            _generate(e, tiles, timers, amap, pos, orient, inv, rng, margin, side, n_walls, n_res, n_conv)
            depleted[e] = 0
            steps[e] = 0
            starts[e] = 0
        else:
            for a in range(n):
                truncated[e * n + a] = False
                episode_done[e * n + a] = False
        _render_env(e, tiles, amap, pos, orient, inv, cap, obs)
    return 0


class GridworldVec:
    """``num_envs`` gridworlds of ``num_agents`` agents each, stepped together by numba kernels."""

    def __init__(self, num_envs: int, *, num_agents: int, obs_height: int = 11, obs_width: int = 11,
                 max_steps: int = DEFAULT_MAX_STEPS, kwargs: Mapping[str, Any] | None = None) -> None:
        """Create the envs; ``kwargs`` are the map settings of ``GRID_KWARGS`` (see ``grid_settings``)."""
        if num_envs <= 0:
            raise EnvConfigError(f"GridworldVec needs num_envs >= 1, got {num_envs}")
        if obs_height < 1 or obs_width < 1:
            raise EnvConfigError(f"gridworld obs window must be at least 1x1, got {obs_height}x{obs_width}")
        settings = grid_settings(kwargs or {}, num_agents)
        self.settings = settings
        self.spec = self.spec_for(num_agents, obs_height, obs_width)
        self.num_envs = num_envs
        self.num_agents = num_agents
        self.max_steps = max_steps if max_steps > 0 else DEFAULT_MAX_STEPS
        self.side = settings["map_size"]
        self.margin = max(1, obs_height // 2, obs_width // 2)
        grid = self.side + 2 * self.margin
        self._tiles = np.full((num_envs, grid, grid), WALL, dtype=np.uint8)
        self._timers = np.zeros((num_envs, grid, grid), dtype=np.int32)
        self._amap = np.full((num_envs, grid, grid), -1, dtype=np.int32)
        self._pos = np.zeros((num_envs, num_agents, 2), dtype=np.int64)
        self._orient = np.zeros((num_envs, num_agents), dtype=np.int64)
        self._inv = np.zeros((num_envs, num_agents), dtype=np.int64)
        self._depleted = np.zeros(num_envs, dtype=np.int64)
        self._steps = np.zeros(num_envs, dtype=np.int64)
        self._starts = np.zeros(num_envs, dtype=np.int64)
        """Step each env's current episode started at (non-zero only for a staggered first episode)."""
        self._returns = np.zeros((num_envs, num_agents), dtype=np.float64)
        self._collected = np.zeros((num_envs, num_agents), dtype=np.int64)
        self._converted = np.zeros((num_envs, num_agents), dtype=np.int64)
        self._rng = np.zeros(num_envs, dtype=np.int64)
        self._seeded = False

    @staticmethod
    def spec_for(num_agents: int, obs_height: int, obs_width: int) -> EnvSpec:
        """The spec of a gridworld with this agent count and observation window."""
        return EnvSpec(num_agents=num_agents, obs_shape=(NUM_CHANNELS, obs_height, obs_width),
                       obs_dtype="uint8", action=ActionSpace.discrete(NUM_ACTIONS), image_layout="chw",
                       episode_stats=EPISODE_STATS)

    def _map_args(self) -> tuple:
        s = self.settings
        return (self._tiles, self._timers, self._amap, self._pos, self._orient, self._inv, self._depleted,
                self._steps, self._returns, self._collected, self._converted, self._rng, self.margin, self.side,
                s["num_walls"], s["num_resources"], s["num_converters"], s["inventory_cap"])

    def reset(self, buffers: StepBuffers, seed: int) -> None:
        """Reseed every env's stream from ``seed``, draw fresh maps, write first observations, clear the rest."""
        self._rng[:] = np.random.default_rng(seed).integers(1, 2**62, size=self.num_envs, dtype=np.int64)
        self._seeded = True
        _reset_kernel(*self._map_args(), buffers.obs, self._starts, self.settings["stagger_start"], self.max_steps)
        buffers.clear_step_outputs()

    def step(self, buffers: StepBuffers) -> None:
        """Apply ``buffers.actions`` (0 noop, 1 forward, 2 left, 3 right, 4 use); write results; auto-reset."""
        if not self._seeded:
            raise RuntimeError("GridworldVec.step() called before reset()")
        code = _step_kernel(
            *self._map_args(), self.settings["regrow_steps"], self.max_steps, _DY, _DX,
            buffers.actions, buffers.obs, buffers.rewards, buffers.terminated, buffers.truncated,
            buffers.final_obs, buffers.episode_done, buffers.episode_return, buffers.episode_length,
            buffers.episode_stats, self._starts,
        )
        if code < 0:
            i = -1 - code
            raise EnvConfigError(f"GridworldVec: action {int(buffers.actions[i])} for agent slot {i} is out of "
                             f"range; actions must be in [0, {NUM_ACTIONS})")

    def close(self) -> None:
        """Nothing to release."""

    # --- test hooks: set and read one env's map by hand ---------------------------------------------------

    def set_map(self, env_index: int, rows: Sequence[str], *, orientations: Sequence[int] | None = None,
                inventories: Sequence[int] | None = None, buffers: StepBuffers | None = None) -> None:
        """Replace env ``env_index``'s map by ``rows`` (interior coordinates; cells outside ``rows`` are walls).

        Characters: '#' wall, '.' empty, 'R' resource, 'C' converter, 'r' depleted resource (regrows after
        ``regrow_steps`` steps), '0'..'9' / 'a'..'z' agent 0..35 on an empty cell. Every agent must appear
        exactly once. Orientations default to north, inventories to 0. The step count is kept. With
        ``buffers``, that env's observations are rewritten.
        """
        e = env_index
        if len(rows) > self.side or any(len(row) > self.side for row in rows):
            raise EnvConfigError(f"set_map: rows must fit the {self.side}x{self.side} interior")
        m = self.margin
        self._tiles[e, m:m + self.side, m:m + self.side] = WALL
        self._timers[e] = 0
        self._amap[e] = -1
        self._depleted[e] = 0
        seen = []
        codes = {"#": WALL, ".": EMPTY, "R": RESOURCE, "C": CONVERTER, "r": DEPLETED}
        for y, row in enumerate(rows):
            for x, ch in enumerate(row):
                gy, gx = m + y, m + x
                if ch in codes:
                    self._tiles[e, gy, gx] = codes[ch]
                    if ch == "r":
                        self._timers[e, gy, gx] = self.settings["regrow_steps"]
                        self._depleted[e] += 1
                    continue
                a = int(ch, 36)
                if a >= self.num_agents or a in seen:
                    raise EnvConfigError(f"set_map: agent {ch!r} is out of range or repeated")
                seen.append(a)
                self._tiles[e, gy, gx] = EMPTY
                self._amap[e, gy, gx] = a
                self._pos[e, a] = (gy, gx)
        if sorted(seen) != list(range(self.num_agents)):
            raise EnvConfigError(f"set_map: rows must place all {self.num_agents} agents, got {sorted(seen)}")
        self._orient[e] = 0 if orientations is None else np.asarray(orientations)
        self._inv[e] = 0 if inventories is None else np.asarray(inventories)
        if buffers is not None:
            _render_env(e, self._tiles, self._amap, self._pos, self._orient, self._inv,
                        self.settings["inventory_cap"], buffers.obs)

    def agent_state(self, env_index: int, agent: int) -> tuple[int, int, int, int]:
        """``(row, col, orientation, inventory)`` of one agent, row/col in interior coordinates."""
        y, x = self._pos[env_index, agent]
        return (int(y) - self.margin, int(x) - self.margin, int(self._orient[env_index, agent]),
                int(self._inv[env_index, agent]))

    def tile(self, env_index: int, row: int, col: int) -> int:
        """The tile code (EMPTY, WALL, RESOURCE, CONVERTER, DEPLETED) at interior coordinates."""
        return int(self._tiles[env_index, self.margin + row, self.margin + col])
