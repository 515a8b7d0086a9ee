"""Baseline names to players, in one place: what the arena, the ELO tool, ``evaluate --opponent``, evaluation during
training and actor hosts (``selfplay.baseline_opponents``) play.

A name (``configs.baselines``) is ``random`` (uniformly random legal actions, any env with action masks),
``one_ply`` or ``negamax-<depth>`` (Connect Four's, ``envs/builtin/connect_four/players.py``), or an entry point
``module.path:callable``: the callable is called as ``fn(seed=<int>)`` and must return a player, an object with
``act(obs, masks) -> actions`` (``obs`` [n, *obs_shape], ``masks`` [n, mask_size], 1 = legal; actions [n,
*action_shape]) and optionally ``name`` and ``reseed(seed)`` (``evaluation.arena.play_match`` calls it before a
match). A class is such a callable, e.g. ``examples.tictactoe_players:MinimaxPlayer``.

Every failure is raised as the caller's ``error`` type, its message starting with the caller's ``where`` (e.g.
``--opponent 'x:y'``) and saying what is wrong: an unknown name, a module that cannot be imported, a missing
attribute, something not callable, a call that raised, a result without ``act``.
"""

from __future__ import annotations

from typing import Any

from configs.baselines import BASELINE_FORMS, baseline_strength, is_entry_point_form
from envs.adapters.entry_point import import_attribute
from envs.builtin.connect_four.players import baseline_player as fixed_baseline_player
from envs.errors import EnvConfigError


def baseline_player(name: str, *, seed: int, where: str = "", error: type[Exception] = EnvConfigError) -> Any:
    """The player baseline ``name`` names, seeded with ``seed``; ``error`` (its message after ``where: ``) when it
    names none."""
    prefix = f"{where}: " if where else ""
    if baseline_strength(name) is not None:
        return fixed_baseline_player(name, seed=seed)
    if is_entry_point_form(name):
        return entry_point_player(name, seed=seed, where=where or f"baseline {name!r}", error=error)
    raise error(f"{prefix}unknown baseline {name!r}; allowed: {BASELINE_FORMS}")


def entry_point_player(text: str, *, seed: int, where: str, error: type[Exception]) -> Any:
    """The player entry point ``text`` (``module.path:callable``) returns when called as ``fn(seed=seed)``."""
    module_name, _, attr_path = text.partition(":")
    target = import_attribute(module_name, attr_path.split("."), where=where, error=error)
    if not callable(target):
        raise error(f"{where} is not callable (its type is {type(target).__name__})")
    try:
        player = target(seed=seed)
    except Exception as err:  # the user's code: whatever it raised is the message
        raise error(f"{where}: calling it as fn(seed={seed}) raised {err!r}") from err
    if not callable(getattr(player, "act", None)):
        raise error(f"{where} returned a {type(player).__name__}, not a player (an object with act(obs, masks) -> "
                    f"actions)")
    return player
