"""Built-in Connect Four: a vectorised two-player env for self-play, stepped by numba kernels.

Board: 6 rows x 7 columns, row 0 at the top (PettingZoo's ``connect_four_v3`` layout); a move drops a stone
into a column (action 0..6), and four in a row (horizontal, vertical or either diagonal) wins. A game ends
with a win or a full board (42 moves, a draw); the rules match ``connect_four_v3`` move for move
(tests/test_connect_four.py plays hundreds of random games in both).

Agent slots: env ``e`` has two, slot ``2e`` is the player who moves first in every game of that env ("P0"),
slot ``2e + 1`` the second player ("P1"). Observation ``[2, 6, 7]`` uint8 from the slot's own point of view:
plane 0 its own stones, plane 1 the opponent's, ``STONE`` (255) where a stone is, 0 elsewhere (uint8
observations are scaled by 1/255 in the model, so a stone reads as 1.0); so one policy can play either seat.
Action mask: the columns that are not full.

Turns are carried by ``active``: on every step exactly one slot per env is active, the player to move; the
other slot is inactive (the host neither acts nor records for it, and its action is ignored). An active
slot's action must be a column in ``[0, 7)`` that is not full, otherwise ``step`` raises a ``ValueError``
naming the env, slot and column (and steps nothing).

Rewards and episode ends (each player's episode is one game; its steps are its own moves):

* During a game every reward is 0. The step that applies P0's move makes P1 active with the new board (reward
  0), and vice versa, so the steps the host records for one slot are that player's own decisions, and each
  transition runs own move -> opponent's reply -> own next observation.
* The move that ends a game (win, draw or time limit) is the last step of BOTH players' episodes. On that
  step both slots report ``episode_done`` with their ``episode_return`` (+1 win, -1 loss, 0 draw or
  truncation), ``episode_length`` (their own move count) and ``episode_stats``; then the env resets. The new
  game starts with P0 to move, so P0 is active at once and gets its terminal reward now (``+1``/``-1``/0 with
  ``terminated=True``, or ``truncated=True`` with ``final_obs``) together with the empty board. P1 is
  inactive on that step: its terminal reward and done flag are HELD and written on its next active step,
  the step after P0's first move of the new game, together with that board (P1's first observation of its
  next episode). That holds whoever made the last move: the winner's +1 and the loser's -1 each end up on
  that player's last recorded transition.
* ``max_steps``: games never exceed 42 moves, so ``max_steps <= 0`` or ``>= 42`` means no limit. With
  ``2 <= max_steps < 42`` a game still going after ``max_steps`` moves is truncated (reward 0 for both,
  ``truncated`` instead of ``terminated``, delivered like the terminal case). Its ``final_obs`` is the final
  board from that player's point of view (for the player who made the last move, a position with the
  opponent to move). ``max_steps == 1`` is refused: P1 would never move.

Episode statistics (the same values in both players' reports): ``first_player_won``, ``second_player_won``,
``draw`` (0/1; all 0 for a truncated game) and ``moves`` (stones played in the game). Nothing is random, so
``reset``'s seed is unused. Baseline opponents live in ``envs/builtin/connect_four/baselines.py``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from envs.base import EnvSpec, StepBuffers
from envs.spaces import ActionSpace
from envs.errors import EnvConfigError

ROWS, COLS = 6, 7
CELLS = ROWS * COLS
STONE = 255
"""Value of a stone in the observation planes."""
EPISODE_STATS = ("first_player_won", "second_player_won", "draw", "moves")

# Directions of a line: horizontal, vertical, diagonal down-right, diagonal down-left.
_LINE_DR = (0, 1, 1, 1)
_LINE_DC = (1, 0, 1, -1)


@njit(cache=True)
def wins_through(grid: np.ndarray, row: int, col: int, piece: int) -> bool:
    """Whether a ``piece`` stone at ``(row, col)`` of a [6, 7] grid makes four in a row (the cell itself is
    counted as ``piece`` whatever it holds)."""
    for d in range(4):
        dr = _LINE_DR[d]
        dc = _LINE_DC[d]
        count = 1
        r = row + dr
        c = col + dc
        while 0 <= r < ROWS and 0 <= c < COLS and grid[r, c] == piece:
            count += 1
            r += dr
            c += dc
        r = row - dr
        c = col - dc
        while 0 <= r < ROWS and 0 <= c < COLS and grid[r, c] == piece:
            count += 1
            r -= dr
            c -= dc
        if count >= 4:
            return True
    return False


@njit(cache=True)
def _render(board, e, player, out, slot):
    """Player ``player`` (0/1)'s view of env ``e``'s board into ``out[slot]``: own stones, then the opponent's."""
    own = player + 1
    for r in range(ROWS):
        for c in range(COLS):
            v = board[e, r, c]
            out[slot, 0, r, c] = STONE if v == own else 0
            out[slot, 1, r, c] = STONE if v != 0 and v != own else 0


@njit(cache=True)
def _observe_env(board, heights, e, obs, masks):
    """Both players' observations and the legal columns (the same for both) of env ``e``."""
    for p in range(2):
        _render(board, e, p, obs, 2 * e + p)
        for c in range(COLS):
            masks[2 * e + p, c] = 1 if heights[e, c] < ROWS else 0


@njit(cache=True)
def _new_game(board, heights, mover, moves, player_moves, returns, e):
    for r in range(ROWS):
        for c in range(COLS):
            board[e, r, c] = 0
    for c in range(COLS):
        heights[e, c] = 0
    mover[e] = 0
    moves[e] = 0
    for p in range(2):
        player_moves[e, p] = 0
        returns[e, p] = 0.0


@njit(cache=True)
def _reset_kernel(board, heights, mover, moves, player_moves, returns, held, obs, masks, active):
    for e in range(board.shape[0]):
        _new_game(board, heights, mover, moves, player_moves, returns, e)
        held[e] = 0
        _observe_env(board, heights, e, obs, masks)
        active[2 * e] = True
        active[2 * e + 1] = False


@njit(cache=True)
def _step_kernel(board, heights, mover, moves, player_moves, returns, held, held_reward, held_final, max_steps,
                 actions, obs, masks, active, rewards, terminated, truncated, final_obs, episode_done,
                 episode_return, episode_length, episode_stats) -> int:
    """Apply every env's move; returns 0, or ``-1 - e`` if env ``e``'s mover chose an illegal column (then
    nothing was stepped)."""
    num_envs = board.shape[0]
    for e in range(num_envs):
        col = actions[2 * e + mover[e]]
        if col < 0 or col >= COLS or heights[e, col] >= ROWS:
            return -1 - e
    for e in range(num_envs):
        for s in range(2 * e, 2 * e + 2):
            rewards[s] = 0.0
            terminated[s] = False
            truncated[s] = False
            episode_done[s] = False
            episode_return[s] = 0.0
            episode_length[s] = 0
            for k in range(episode_stats.shape[1]):
                episode_stats[s, k] = 0.0
        m = mover[e]
        col = actions[2 * e + m]
        row = ROWS - 1 - heights[e, col]
        board[e, row, col] = m + 1
        heights[e, col] += 1
        moves[e] += 1
        player_moves[e, m] += 1
        win = wins_through(board[e], row, col, m + 1)
        draw = not win and moves[e] == CELLS
        cut = not win and not draw and max_steps > 0 and moves[e] >= max_steps
        if win or draw or cut:
            for p in range(2):
                s = 2 * e + p
                r = 0.0
                if win:
                    r = 1.0 if p == m else -1.0
                returns[e, p] += r
                episode_done[s] = True
                episode_return[s] = returns[e, p]
                episode_length[s] = player_moves[e, p]
                episode_stats[s, 0] = 1.0 if win and m == 0 else 0.0
                episode_stats[s, 1] = 1.0 if win and m == 1 else 0.0
                episode_stats[s, 2] = 1.0 if draw else 0.0
                episode_stats[s, 3] = moves[e]
                if p == 0:  # P0 moves first in the next game: its episode end is delivered now
                    rewards[s] = r
                    terminated[s] = not cut
                    truncated[s] = cut
                    if cut:
                        _render(board, e, 0, final_obs, s)
                else:  # P1 sits out P0's first move: held until its next active step
                    held[e] = 2 if cut else 1
                    held_reward[e] = r
                    if cut:
                        _render(board, e, 1, held_final, e)
            _new_game(board, heights, mover, moves, player_moves, returns, e)
        else:
            mover[e] = 1 - m
            if mover[e] == 1 and held[e] != 0:  # P1's first move of a game: deliver its last episode's end
                s = 2 * e + 1
                rewards[s] = held_reward[e]
                terminated[s] = held[e] == 1
                truncated[s] = held[e] == 2
                if held[e] == 2:
                    final_obs[s] = held_final[e]
                held[e] = 0
                held_reward[e] = 0.0
        active[2 * e + mover[e]] = True
        active[2 * e + 1 - mover[e]] = False
        _observe_env(board, heights, e, obs, masks)
    return 0


class ConnectFourVec:
    """``num_envs`` Connect Four games; slot ``2e`` moves first in env ``e``, slot ``2e + 1`` second."""

    SPEC = EnvSpec(num_agents=2, obs_shape=(2, ROWS, COLS), obs_dtype="uint8", action=ActionSpace.discrete(COLS),
                   action_mask=True, episode_stats=EPISODE_STATS, image_layout="chw")

    def __init__(self, num_envs: int, *, max_steps: int = 0) -> None:
        """``max_steps``: moves after which a game is truncated; ``<= 0`` or ``>= 42`` means no limit."""
        if num_envs < 1:
            raise EnvConfigError(f"ConnectFourVec needs num_envs >= 1, got {num_envs}")
        check_max_steps(max_steps)
        self.spec = self.SPEC
        self.num_envs = num_envs
        self.num_agents = 2
        self.max_steps = max_steps if 0 < max_steps < CELLS else 0
        self._board = np.zeros((num_envs, ROWS, COLS), dtype=np.int8)
        self._heights = np.zeros((num_envs, COLS), dtype=np.int64)
        self._mover = np.zeros(num_envs, dtype=np.int64)
        self._moves = np.zeros(num_envs, dtype=np.int64)
        self._player_moves = np.zeros((num_envs, 2), dtype=np.int64)
        self._returns = np.zeros((num_envs, 2), dtype=np.float32)
        self._held = np.zeros(num_envs, dtype=np.int8)  # 0 nothing held for P1, 1 terminated, 2 truncated
        self._held_reward = np.zeros(num_envs, dtype=np.float32)
        self._held_final = np.zeros((num_envs, 2, ROWS, COLS), dtype=np.uint8)
        self._was_reset = False

    def _state(self) -> tuple:
        return (self._board, self._heights, self._mover, self._moves, self._player_moves, self._returns, self._held)

    def reset(self, buffers: StepBuffers, seed: int) -> None:
        """Empty boards, P0 to move in every env (P1 slots inactive); ``seed`` is unused (no randomness)."""
        buffers.clear_step_outputs()
        _reset_kernel(*self._state(), buffers.obs, buffers.action_mask, buffers.active)
        self._held_reward[:] = 0.0
        self._was_reset = True

    def step(self, buffers: StepBuffers) -> None:
        """Apply each env's mover's column; write results, deliver held episode ends, reset finished games."""
        if not self._was_reset:
            raise RuntimeError("ConnectFourVec.step() called before reset()")
        code = _step_kernel(*self._state(), self._held_reward, self._held_final, self.max_steps,
                            buffers.actions, buffers.obs, buffers.action_mask, buffers.active, buffers.rewards,
                            buffers.terminated, buffers.truncated, buffers.final_obs, buffers.episode_done,
                            buffers.episode_return, buffers.episode_length, buffers.episode_stats)
        if code < 0:
            e = -1 - code
            player = int(self._mover[e])
            slot = 2 * e + player
            col = int(buffers.actions[slot])
            why = "is full" if 0 <= col < COLS else f"is out of range [0, {COLS})"
            raise EnvConfigError(f"ConnectFourVec: env {e}, agent slot {slot} (player {player + 1} to move): "
                             f"illegal move, column {col} {why}")

    def close(self) -> None:
        """Nothing to release."""

    # --- read-only views for tests and tools ----------------------------------------------------------------

    def board(self, env_index: int) -> np.ndarray:
        """A copy of env ``env_index``'s board: [6, 7] int8, row 0 at the top, 0 empty, 1 P0's, 2 P1's stones."""
        return self._board[env_index].copy()

    def to_move(self, env_index: int) -> int:
        """0 if P0 (slot ``2e``) is to move in env ``env_index``, 1 if P1."""
        return int(self._mover[env_index])


def check_max_steps(max_steps: int) -> None:
    """ValueError for ``max_steps == 1`` (the second player would never move)."""
    if max_steps == 1:
        raise EnvConfigError("env.max_steps for env 'connect_four' must be >= 2 (or <= 0 for no limit; games end by "
                         "42 moves anyway), got 1: with 1 the second player would never move")
