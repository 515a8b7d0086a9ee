"""The layout of a ROWS message: one definition for the actor's sender and the learner's ingest."""

from __future__ import annotations

from protocol.validation import ArraySpec

ROW_STEP_FIELDS: dict[str, str] = {
    "logprobs": "float32",
    "values": "float32",
    "rewards": "float32",
    "dones": "uint8",
    "bootstrap": "float32",
}
"""Scalar per-step fields of a row, with their wire dtypes (obs, actions and masks depend on the env)."""

HOST_STATS: tuple[str, ...] = ("inference_batches", "inference_agents", "inference_s", "act_s", "worker_wait_s",
                               "worker_step_s")
"""Keys of a ROWS message's optional ``host_stats`` map: the actor host's counters since its last message
(forward passes, agents decided for, seconds in the policy, seconds in the whole inference step, seconds its
env workers waited for actions and spent stepping). Each a finite number >= 0."""


def row_array_specs(*, obs_shape: tuple[int, ...], obs_dtype: str, horizon: int, state_size: int = 0,
                    action_shape: tuple[int, ...] = (), action_dtype: str = "int32",
                    mask_size: int = 0) -> dict[str, ArraySpec]:
    """Array specs of a ROWS message for rows of ``horizon`` (= bptt_horizon + 1) steps.

    ``actions`` are [rows, horizon, *action_shape] in the action space's dtype (int32 or float32, finite),
    ``action_masks`` [rows, horizon, mask_size] uint8 (width 0 when the env has no masks), and ``states``
    [rows, state_size] the policy's recurrent state before step 0 of each row (width 0 for feed-forward
    policies).
    """
    specs = {"obs": ArraySpec(dtype=obs_dtype, shape=(-1, horizon, *obs_shape)),
             "actions": ArraySpec(dtype=action_dtype, shape=(-1, horizon, *action_shape),
                                  allow_nonfinite=False),
             "action_masks": ArraySpec(dtype="uint8", shape=(-1, horizon, mask_size))}
    for name, dtype in ROW_STEP_FIELDS.items():
        finite = dtype.startswith("float")
        specs[name] = ArraySpec(dtype=dtype, shape=(-1, horizon), allow_nonfinite=not finite)
    specs["versions"] = ArraySpec(dtype="int64", shape=(-1,))
    specs["states"] = ArraySpec(dtype="float32", shape=(-1, state_size))
    return specs
