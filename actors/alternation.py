"""Self-play on an actor host: the envs' opponents, drawn from the pool server at start and at each alternation.

Every ``selfplay.alternation_steps`` env steps per env the host asks the pool server for a new assignment;
``Opponents`` hands it to each env at its next episode end. The first assignment is fetched when this is
built (blocking: nothing plays without one); a later one that fails leaves the current opponents playing.
The first alternation is logged at INFO, later ones at most once per ``INFO_EVERY_S`` (the rest at DEBUG), and
``summary`` (logged when the host stops) says how many there were.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from actors.opponents import Opponents
from actors.pool_client import PoolClient, PoolError

LOG = logging.getLogger("sluice.actors")
INFO_EVERY_S = 60.0
"""Seconds between two alternation lines at INFO (alternations come every few seconds)."""


class OpponentAlternation:
    """When to draw the next opponents, and drawing them."""

    def __init__(self, *, client: PoolClient, opponents: Opponents, steps_per_alternation: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.opponents = opponents
        self.steps_per_alternation = steps_per_alternation
        """Env steps (all the host's envs together) between two alternations."""
        self.started_at = 0
        """The stepper's env step count when the current alternation began."""
        self.clock = clock
        self.draws = 0
        """Assignments this host drew (the first one included)."""
        self.last_alternation: int | None = None
        """The pool server's number of the newest assignment drawn."""
        self._logged_at: float | None = None
        self._draw()

    def maybe_next(self, env_steps: int) -> None:
        """Draw the envs' next opponents if ``env_steps`` (the host's total) says an alternation is due."""
        if env_steps - self.started_at < self.steps_per_alternation:
            return
        self.started_at = env_steps
        try:
            self._draw()
        except (PoolError, ValueError) as err:  # a failed or bad answer (e.g. a snapshot's bytes do not match
            # its digest): keep playing the current opponents; try again next alternation
            LOG.warning("no new opponents this alternation: %s", err)

    def summary(self) -> str:
        """One line on this host's alternations so far."""
        return (f"self-play: drew opponents {self.draws} times (last: alternation {self.last_alternation}), "
                f"{self.opponents.cache.downloads} snapshots downloaded")

    def _draw(self) -> None:
        num_envs = len(self.opponents.env_digests)
        assignment = self.client.opponents(num_envs)
        self.opponents.assign(assignment)
        self.draws += 1
        self.last_alternation = assignment.alternation
        now = self.clock()
        level = logging.DEBUG
        if self._logged_at is None or now - self._logged_at >= INFO_EVERY_S:
            level, self._logged_at = logging.INFO, now
        LOG.log(level, "alternation %d: %d envs play %d unique opponents (%d snapshots downloaded so far)",
                assignment.alternation, num_envs, len(set(assignment.digests)), self.opponents.cache.downloads)
