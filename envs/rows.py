"""The rows an env's steps travel in: its spec mapped onto ``protocol.rows.RowLayout``, the one mapping actor hosts
(the assembler) and the learner (the ingest's checks and batches) both use."""

from __future__ import annotations

from dataclasses import dataclass

from configs.schema import RunConfig
from envs.base import EnvSpec
from protocol.rows import RowLayout


def row_layout(env: EnvSpec, *, horizon: int, state_size: int, team: bool = False) -> RowLayout:
    """The rows of an env's ROWS messages: ``horizon`` (bptt_horizon + 1) steps, the policy's state width; with
    ``team``, one row per env holding all its agents (COMA's joint rows, ``protocol.rows``)."""
    if team:
        n = env.num_agents
        return RowLayout(horizon=horizon, obs_shape=(n, *env.obs_shape), obs_dtype=env.obs_dtype,
                         action_shape=(n, *env.action.shape), action_dtype=env.action.dtype,
                         action_nvec=env.action.nvec, mask_size=env.mask_size, state_size=state_size,
                         team_size=n, global_state_size=env.state_size)
    return RowLayout(horizon=horizon, obs_shape=env.obs_shape, obs_dtype=env.obs_dtype,
                     action_shape=env.action.shape, action_dtype=env.action.dtype, action_nvec=env.action.nvec,
                     mask_size=env.mask_size, state_size=state_size)


def run_row_layout(config: RunConfig, env: EnvSpec, *, state_size: int) -> RowLayout:
    """The rows a run's hosts send and its learner takes: ``trainer.bptt_horizon + 1`` steps, the policy's state
    width, and team rows when the run trains COMA (``trainer.algorithm: coma``)."""
    return row_layout(env, horizon=config.trainer.bptt_horizon + 1, state_size=state_size,
                      team=config.trainer.algorithm == "coma")


@dataclass(frozen=True, kw_only=True)
class MessageSizing:
    """How rows travel to the learner, derived the same way by hosts and learner (``message_sizing``)."""

    rows: int
    """The most rows one ROWS message carries: the host ships full blocks of it, the learner refuses more and
    bounds a message's reported steps by it."""
    hwm: int
    """The data sockets' ZeroMQ high-water mark in messages: hwm x rows stays within send_queue_messages x
    rows_per_message rows, so bigger messages leave the rows in flight (and their staleness) as they were."""


def message_sizing(config: RunConfig, layout: RowLayout) -> MessageSizing:
    """``network.rows_per_message`` rows per message, or as many small rows as fit in ``network.message_bytes``
    (and in half of ``max_message_bytes``) when that is more, up to one batch's segments and half the rows in flight
    (send_queue_messages x rows_per_message: two messages at least may be in flight); the high-water mark keeps
    those rows in flight."""
    network = config.network
    in_flight = network.send_queue_messages * network.rows_per_message
    by_bytes = min(network.message_bytes, network.max_message_bytes // 2) // layout.row_nbytes()
    segments = config.trainer.batch_size // config.trainer.bptt_horizon
    rows = max(network.rows_per_message, min(by_bytes, segments, in_flight // 2))
    return MessageSizing(rows=rows, hwm=max(1, in_flight // rows))
