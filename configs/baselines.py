"""The names of the fixed baseline players of two-player envs, checked without importing the players.

``evaluation.elo``'s ``--baselines`` and the ``evaluation.baselines`` config key name baselines the same way:
``random``, ``one_ply`` or ``negamax-<depth>`` (depth an integer >= 1). The players themselves live in
``evaluation.arena``; this module only knows their names, so configs can validate them.
"""

from __future__ import annotations

BASELINE_ENVS = ("connect_four",)
"""Env names with fixed baseline players (two-player turn-based; the arena can play them)."""
NEGAMAX_PREFIX = "negamax-"
"""A negamax baseline's name is this prefix and its search depth, e.g. ``negamax-4``."""
BASELINE_FORMS = "random, one_ply, negamax-<depth> (depth an integer >= 1)"
"""How baseline names may look, for error messages."""
BASELINE_DIGEST_PREFIX = "baseline:"
"""How the pool server names a baseline opponent in an assignment's digests (``selfplay.baseline_opponents``),
e.g. ``baseline:one_ply``; actor hosts play it themselves instead of downloading a snapshot."""
FIXED_BASELINES = ("random", "one_ply")
"""The baselines without a parameter, weakest first."""


def baseline_strength(name: str) -> int | None:
    """A rank that orders baselines weakest first (random 0, one_ply 1, negamax-d 1 + d), or None when ``name``
    is not a baseline name (no leading zeros in the depth)."""
    if name in FIXED_BASELINES:
        return FIXED_BASELINES.index(name)
    depth = name[len(NEGAMAX_PREFIX):] if name.startswith(NEGAMAX_PREFIX) else ""
    if depth.isascii() and depth.isdigit() and depth == str(int(depth)) and int(depth) >= 1:
        return len(FIXED_BASELINES) - 1 + int(depth)
    return None
