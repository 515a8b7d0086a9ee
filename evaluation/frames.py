"""Simple RGB frames of env 0 of the built-in envs, drawn with NumPy (for ``python -m evaluation.evaluate --video``).

CartPole is drawn from its observation (cart and pole as rectangles), the gridworld from its tiles and agent
positions (coloured cells), Connect Four from its board; Gymnasium and PettingZoo envs draw themselves. Frame sides
are multiples of 16, as video encoders like.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from envs.base import StepBuffers, VecEnv
from envs.builtin.cartpole import LENGTH, X_THRESHOLD
from envs.builtin.gridworld import CONVERTER, DEPLETED, EMPTY, RESOURCE, WALL

FrameDrawer = Callable[[VecEnv, StepBuffers], np.ndarray]
"""Draws env 0 as a [height, width, 3] uint8 frame."""

SELF_RENDERING_ENVS = ("gymnasium", "pettingzoo", "pettingzoo_aec")
"""The env.name values whose envs draw themselves: made with ``render_mode='rgb_array'``, env 0's ``render()``."""
DRAWN_ENVS = ("cartpole", "gridworld", "connect_four", *SELF_RENDERING_ENVS)
"""The env.name values ``frame_drawer`` can draw."""

CARTPOLE_SIZE = (240, 384)
"""(height, width) of a CartPole frame."""
GRID_CELL = 16
"""Pixels per gridworld cell side."""
BOARD_CELL = 48
"""Pixels per Connect Four cell side."""

_GRID_COLOURS = {EMPTY: (235, 235, 235), WALL: (70, 70, 70), RESOURCE: (60, 170, 60),
                 CONVERTER: (60, 90, 200), DEPLETED: (170, 200, 140)}
_AGENT_COLOUR = (210, 50, 50)
_STONE_COLOURS = ((230, 230, 230), (220, 40, 40), (240, 200, 30))
_BOARD_BLUE = (30, 60, 170)


def frame_drawer(env_name: str) -> FrameDrawer:
    """The drawer for env ``env_name`` (ValueError naming the drawable envs for any other)."""
    drawers = {"cartpole": draw_cartpole, "gridworld": draw_gridworld, "connect_four": draw_connect_four,
               **{name: draw_own_render for name in SELF_RENDERING_ENVS}}
    if env_name not in drawers:
        allowed = ", ".join(repr(name) for name in DRAWN_ENVS)
        raise ValueError(f"--video cannot draw env {env_name!r}; allowed envs: {allowed}")
    return drawers[env_name]


def draw_own_render(env: VecEnv, buffers: StepBuffers) -> np.ndarray:
    """Env 0 of a Gymnasium or PettingZoo env, as its own ``render()`` draws it (the adapter's ``render_first``)."""
    return env.render_first()


def draw_cartpole(env: VecEnv, buffers: StepBuffers) -> np.ndarray:
    """Env 0 of CartPole from its observation [x, x_dot, theta, theta_dot]: track, cart and pole."""
    height, width = CARTPOLE_SIZE
    frame = np.full((height, width, 3), 255, dtype=np.uint8)
    x, _, theta, _ = (float(v) for v in buffers.obs[0])
    scale = width / (2 * X_THRESHOLD)
    ground = int(height * 0.75)
    frame[ground:ground + 2, :] = 0
    cart_x = int(round(width / 2 + x * scale))
    _fill(frame, ground - 15, ground + 15, cart_x - 25, cart_x + 25, (40, 40, 40))
    pole = 2 * LENGTH * scale
    for t in np.linspace(0.0, 1.0, int(pole)):
        px = int(round(cart_x + math.sin(theta) * pole * t))
        py = int(round(ground - 15 - math.cos(theta) * pole * t))
        _fill(frame, py - 3, py + 3, px - 3, px + 3, (200, 120, 60))
    return frame


def draw_gridworld(env: VecEnv, buffers: StepBuffers) -> np.ndarray:
    """Env 0 of the gridworld: one coloured cell per tile, agents in red."""
    side = env.side
    frame = np.zeros((side * GRID_CELL, side * GRID_CELL, 3), dtype=np.uint8)
    for row in range(side):
        for col in range(side):
            _cell(frame, row, col, GRID_CELL, _GRID_COLOURS.get(env.tile(0, row, col), (0, 0, 0)))
    for agent in range(env.num_agents):
        row, col, _, _ = env.agent_state(0, agent)
        _cell(frame, row, col, GRID_CELL, _AGENT_COLOUR)
    return frame


def draw_connect_four(env: VecEnv, buffers: StepBuffers) -> np.ndarray:
    """Env 0 of Connect Four: a blue board, P0's stones red, P1's yellow."""
    board = env.board(0)
    rows, cols = board.shape
    frame = np.zeros((rows * BOARD_CELL, cols * BOARD_CELL, 3), dtype=np.uint8)
    frame[:] = _BOARD_BLUE
    margin = BOARD_CELL // 8
    for row in range(rows):
        for col in range(cols):
            top, left = row * BOARD_CELL + margin, col * BOARD_CELL + margin
            _fill(frame, top, top + BOARD_CELL - 2 * margin, left, left + BOARD_CELL - 2 * margin,
                  _STONE_COLOURS[int(board[row, col])])
    return frame


def _cell(frame: np.ndarray, row: int, col: int, size: int, colour: tuple[int, int, int]) -> None:
    """Fill one grid cell, leaving a one-pixel border."""
    _fill(frame, row * size + 1, (row + 1) * size - 1, col * size + 1, (col + 1) * size - 1, colour)


def _fill(frame: np.ndarray, top: int, bottom: int, left: int, right: int, colour: tuple[int, int, int]) -> None:
    """Fill a rectangle, clipped to the frame."""
    height, width = frame.shape[:2]
    frame[max(0, top):min(height, bottom), max(0, left):min(width, right)] = colour
