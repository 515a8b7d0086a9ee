"""The opponent ``python -m evaluation.evaluate --opponent SPEC`` puts against a run's policy on a two-player env.

``SPEC`` is one of:

* a baseline name (``configs.baselines``): ``random``, ``one_ply`` or ``negamax-<depth>`` (those two on
  ``connect_four`` only; ``envs/builtin/connect_four/players.py``);
* ``update:<N>``: the run's pool snapshot taken after learner update ``N`` (``<run-dir>/pool/``,
  ``learner.pool.store.SnapshotStore``; the newest one if several have that update);
* ``digest:<hex>``: the pool snapshot whose sha256 digest is, or starts with, ``<hex>`` (at least
  ``MIN_DIGEST_PREFIX`` hex digits, naming exactly one snapshot);
* ``module:callable``: an entry point, a baseline too (``envs.baseline_players``, where every baseline name is
  resolved); the callable (a function or a class) is called as ``fn(seed=<--seed>)`` and must return a player: an
  object with ``act(obs, masks) -> actions`` (``evaluation.arena.Player``; a ``reseed(seed)`` method, if it has one,
  is called before the games);
* ``self``: no opponent: the policy plays itself in both seats (what ``evaluate`` did before ``--opponent``).

Every problem is an ``OpponentError`` whose message starts with ``--opponent`` and says what is wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from configs.baselines import BASELINE_FORMS, baseline_env_problem, baseline_strength, is_entry_point_form
from configs.schema import RunConfig
from envs.base import EnvSpec
from envs.baseline_players import baseline_player
from evaluation.arena import Player, PolicyPlayer
from learner.pool.store import INDEX_NAME, Snapshot, SnapshotStore, SnapshotStoreError

SELF = "self"
"""``--opponent self``: the policy against itself."""
UPDATE_PREFIX = "update:"
DIGEST_PREFIX = "digest:"
MIN_DIGEST_PREFIX = 6
"""Fewest hex digits a ``digest:`` prefix may have."""
FORMS = f"a baseline ({BASELINE_FORMS}), update:<N> or digest:<hex> (a snapshot of the run's pool) or self"
"""How ``--opponent`` may look, for error messages."""
_HEX_RE = re.compile(r"[0-9a-f]+")
_LISTED = 10
"""Most snapshot updates an error message lists."""


class OpponentError(ValueError):
    """``--opponent`` names nothing usable; the message says why."""


@dataclass(frozen=True, kw_only=True)
class Opponent:
    """A resolved ``--opponent``."""

    name: str
    """How the results name it: the baseline name, ``s<index>-u<update>`` for a snapshot, the entry point text."""
    player: Player | None
    """The player (None for ``self``)."""
    kind: str
    """``baseline``, ``snapshot``, ``entry_point`` or ``self``."""


def resolve_opponent(text: str, *, run_dir: Path, config: RunConfig, spec: EnvSpec, greedy: bool,
                     seed: int) -> Opponent:
    """The opponent ``text`` names for the run in ``run_dir`` (see the module docstring)."""
    text = text.strip()
    if text == SELF:
        return Opponent(name=SELF, player=None, kind="self")
    if baseline_strength(text) is not None:
        problem = baseline_env_problem(text, config.env.name)
        if problem is not None:
            raise OpponentError(f"--opponent: {problem}")
        return Opponent(name=text, player=baseline_player(text, seed=seed), kind="baseline")
    if text.startswith((UPDATE_PREFIX, DIGEST_PREFIX)):
        store = open_pool(run_dir)
        snapshot = find_snapshot(store, text)
        return Opponent(name=f"s{snapshot.index}-u{snapshot.update}",
                        player=snapshot_player(store, snapshot, config, spec, greedy=greedy, seed=seed),
                        kind="snapshot")
    if is_entry_point_form(text):
        player = baseline_player(text, seed=seed, where=f"--opponent {text!r}", error=OpponentError)
        return Opponent(name=text, player=player, kind="entry_point")
    raise OpponentError(f"--opponent {text!r} is not an opponent; use {FORMS}")


def open_pool(run_dir: Path) -> SnapshotStore:
    """The run's snapshot pool; OpponentError when it has none or it is empty."""
    root = run_dir / "pool"
    if not (root / INDEX_NAME).is_file():
        raise OpponentError(f"--opponent names a pool snapshot, but {run_dir} has no snapshot pool "
                            f"({root / INDEX_NAME} does not exist; was the run trained with self-play?)")
    try:
        store = SnapshotStore(root)
    except SnapshotStoreError as err:
        raise OpponentError(f"--opponent: {err}") from err
    if len(store) == 0:
        raise OpponentError(f"--opponent names a pool snapshot, but the pool {root} is empty")
    return store


def find_snapshot(store: SnapshotStore, text: str) -> Snapshot:
    """The snapshot ``update:<N>`` or ``digest:<hex>`` names."""
    snapshots = store.snapshots
    if text.startswith(UPDATE_PREFIX):
        value = text[len(UPDATE_PREFIX):]
        if not (value.isascii() and value.isdigit()):
            raise OpponentError(f"--opponent {text!r}: the update must be an integer >= 0, got {value!r}")
        matching = [s for s in snapshots if s.update == int(value)]
        if not matching:
            raise OpponentError(f"--opponent {text!r}: no pool snapshot was taken after update {int(value)}; "
                                f"snapshot updates: {_updates(snapshots)}")
        return matching[-1]
    digest = text[len(DIGEST_PREFIX):].lower()
    if len(digest) < MIN_DIGEST_PREFIX or not _HEX_RE.fullmatch(digest):
        raise OpponentError(f"--opponent {text!r}: a digest must be at least {MIN_DIGEST_PREFIX} hex digits "
                            f"(a sha256 digest or its start)")
    matching = [s for s in snapshots if s.hash.startswith(digest)]
    if not matching:
        raise OpponentError(f"--opponent {text!r}: no pool snapshot's digest starts with {digest!r}")
    if len({s.hash for s in matching}) > 1:
        raise OpponentError(f"--opponent {text!r}: {len(matching)} pool snapshots' digests start with {digest!r}; "
                            f"give more digits")
    return matching[-1]


def _updates(snapshots: tuple[Snapshot, ...]) -> str:
    updates = list(dict.fromkeys(s.update for s in snapshots))
    if len(updates) <= _LISTED:
        return ", ".join(map(str, updates))
    half = _LISTED // 2
    return (f"{', '.join(map(str, updates[:half]))}, ... ({len(updates) - 2 * half} more), "
            f"{', '.join(map(str, updates[-half:]))}")


def snapshot_player(store: SnapshotStore, snapshot: Snapshot, config: RunConfig, spec: EnvSpec, *, greedy: bool,
                    seed: int) -> PolicyPlayer:
    """A pool snapshot as a player (sampling, or ``greedy``: its most probable legal move)."""
    name = f"s{snapshot.index}-u{snapshot.update}"
    try:
        arrays = store.load(snapshot.index)
        return PolicyPlayer(name, spec, config.model, arrays, greedy=greedy, seed=seed,
                            version=snapshot.policy_version)
    except SnapshotStoreError as err:
        raise OpponentError(f"--opponent: {err}") from err
    except (RuntimeError, ValueError) as err:  # strict load_state_dict, or a model the arena cannot play
        raise OpponentError(f"--opponent: snapshot {name} cannot play: {str(err).splitlines()[0]}") from err
