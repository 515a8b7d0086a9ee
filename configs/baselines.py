"""The names of the baseline players of two-player turn-based envs, checked without importing the players.

``evaluation.elo``'s ``--baselines``, ``evaluation.evaluate``'s ``--opponent``, the ``evaluation.baselines`` and
``selfplay.baseline_opponents`` config keys name baselines the same way:

* ``random``: uniformly random legal actions (any env with action masks);
* ``one_ply`` or ``negamax-<depth>`` (depth an integer >= 1): Connect Four's (env.name ``connect_four`` only);
* an entry point ``module.path:callable`` (``module.path:Class.attr`` too): the callable is called as
  ``fn(seed=<int>)`` and returns a player, an object with ``act(obs, masks) -> actions`` (and, optionally, ``name``
  and ``reseed(seed)``), e.g. ``examples.tictactoe_players:MinimaxPlayer``.

The players themselves are built in one place, ``envs.baseline_players``; this module only knows their names, so
configs can validate them.
"""

from __future__ import annotations

TWO_PLAYER_ENVS = ("connect_four", "pettingzoo_aec")
"""Env names the arena plays (two-player turn-based: ``evaluation.arena``'s env contract), so with baselines,
evaluation during training and self-play baseline opponents (pettingzoo_aec with env.num_agents 2)."""
CONNECT_FOUR_ENV = "connect_four"
"""The env whose own baselines (one_ply, negamax-<depth>) exist."""
NEGAMAX_PREFIX = "negamax-"
"""A negamax baseline's name is this prefix and its search depth, e.g. ``negamax-4``."""
BASELINE_FORMS = ("random, one_ply, negamax-<depth> (depth an integer >= 1; one_ply and negamax connect_four only) "
                  "or an entry point module.path:callable (called as fn(seed=<int>), returning a player)")
"""How baseline names may look, for error messages."""
BASELINE_DIGEST_PREFIX = "baseline:"
"""How the pool server names a baseline opponent in an assignment's digests (``selfplay.baseline_opponents``),
e.g. ``baseline:one_ply``; actor hosts play it themselves instead of downloading a snapshot."""
FIXED_BASELINES = ("random", "one_ply")
"""The baselines without a parameter, weakest first."""


def baseline_strength(name: str) -> int | None:
    """A rank that orders the fixed baselines weakest first (random 0, one_ply 1, negamax-d 1 + d), or None when
    ``name`` is not one of them (no leading zeros in the depth; an entry point is not a fixed baseline)."""
    if name in FIXED_BASELINES:
        return FIXED_BASELINES.index(name)
    depth = name[len(NEGAMAX_PREFIX):] if name.startswith(NEGAMAX_PREFIX) else ""
    if depth.isascii() and depth.isdigit() and depth == str(int(depth)) and int(depth) >= 1:
        return len(FIXED_BASELINES) - 1 + int(depth)
    return None


def is_entry_point_form(text: str) -> bool:
    """Whether ``text`` looks like ``module.path:callable`` (dotted identifiers, one colon, a dotted attribute path)."""
    module_name, sep, attr_path = text.partition(":")
    return bool(sep) and all(part.isidentifier() for part in [*module_name.split("."), *attr_path.split(".")])


def is_baseline_name(name: object) -> bool:
    """Whether ``name`` names a baseline: a fixed one (``baseline_strength``) or an entry point."""
    return isinstance(name, str) and (baseline_strength(name) is not None or is_entry_point_form(name))


def baseline_env_problem(name: str, env_name: str) -> str | None:
    """Why baseline ``name`` cannot play env ``env_name`` (one_ply and negamax are Connect Four's), or None."""
    if env_name != CONNECT_FOUR_ENV and name != "random" and baseline_strength(name) is not None:
        return (f"baseline {name!r} plays env.name {CONNECT_FOUR_ENV!r} only, not {env_name!r}; use random or an "
                f"entry point module.path:callable returning a player for it")
    return None
