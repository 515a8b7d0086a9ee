"""The hostile classes each socket gets: the learner's data socket (PUSH to its PULL), its control socket (DEALER
to its ROUTER), and the opponent pool's requests, on the control socket and on a standalone pool server."""

from __future__ import annotations

import secrets
from collections.abc import Callable

import numpy as np

from genuine import RegisteredSender
from learner.serve.row_checks import LOG_FLOAT32_TINY
from mutations import HostileClass, Outcome, generic_classes, variants_of
from protocol import Message, MessageType
from wire import Parts, parts_of, with_arrays

BIG_INT64 = (1 << 63) - 1
BIG_UINT64 = (1 << 64) - 1
INT32_MAX = (1 << 31) - 1
INT32_MIN = -(1 << 31)


def _message(type_: MessageType, fields: dict | None = None, **kwargs) -> Parts:
    return parts_of(Message(type=type_, sender="fuzz", fields=fields or {}, **kwargs))


# -- data socket -----------------------------------------------------------------------------------------------

def data_classes(sender: RegisteredSender) -> list[HostileClass]:
    """Hostile ROWS blocks, plus a small genuine control group that must be accepted."""
    rows = sender.shape.sizing.rows

    def genuine(rng: np.random.Generator, count: int = rows) -> Parts:
        return parts_of(sender.rows_message(count, rng))

    def unregistered(rng: np.random.Generator) -> Parts:
        return genuine(rng).without_field("token")

    def arrays(rng: np.random.Generator, count: int = rows) -> tuple[Parts, dict[str, np.ndarray]]:
        message = sender.rows_message(count, rng)
        return parts_of(message), {name: np.array(value) for name, value in message.arrays.items()}

    def broken_array(change: Callable[[dict[str, np.ndarray]], None], count: int = rows):
        def make(rng: np.random.Generator) -> Parts:
            parts, values = arrays(rng, count)
            change(values)
            return with_arrays(parts, values)
        return make

    def fields_changed(**changes) -> Callable[[np.random.Generator], Parts]:
        return lambda rng: genuine(rng).with_fields(**changes)

    def field_removed(name: str) -> Callable[[np.random.Generator], Parts]:
        return lambda rng: genuine(rng).without_field(name)

    def set_values(name: str, value) -> Callable[[dict[str, np.ndarray]], None]:
        def change(values: dict[str, np.ndarray]) -> None:
            values[name][...] = value
        return change

    def set_one(name: str, value) -> Callable[[dict[str, np.ndarray]], None]:
        def change(values: dict[str, np.ndarray]) -> None:
            values[name].reshape(-1)[-1] = value
        return change

    field_mutations = {
        **{f"no_{name}": field_removed(name) for name in ("num_rows", "episode_returns", "episode_lengths",
                                                          "env_steps", "agent_steps")},
        "num_rows_str": fields_changed(num_rows=str(rows)), "num_rows_off": fields_changed(num_rows=rows + 1),
        "num_rows_zero": fields_changed(num_rows=0), "returns_map": fields_changed(episode_returns={}),
        "env_steps_float": fields_changed(env_steps=1.5), "agent_steps_none": fields_changed(agent_steps=None),
        "token_int": fields_changed(token=12345), "stats_list": fields_changed(episode_stats=[]),
        "host_stats_str": fields_changed(host_stats="x"), "restarts_bool": fields_changed(env_restarts=True),
        "returns_unpaired": fields_changed(episode_returns=[1.0], episode_lengths=[]),
        "returns_strings": fields_changed(episode_returns=["a"], episode_lengths=[1]),
        "lengths_negative": fields_changed(episode_returns=[1.0], episode_lengths=[-1]),
        "stats_unknown": fields_changed(episode_stats={"no_such_stat": []}),
        "host_stats_unknown": fields_changed(host_stats={"no_such_stat": 1.0}),
        "host_stats_negative": fields_changed(host_stats={"act_s": -1.0}),
        "host_stats_nan": fields_changed(host_stats={"act_s": float("nan")}),
        "type_heartbeat": lambda rng: genuine(rng).with_header(type=MessageType.HEARTBEAT.value),
        "type_register": lambda rng: _message(MessageType.REGISTER, {"host": "fuzz", "num_workers": 1}),
        **{f"no_array_{name}": broken_array(lambda v, n=name: v.pop(n)) for name in sender.shape.layout.specs()},
        "extra_array": broken_array(lambda v: v.update(extra=np.zeros(rows, np.float32))),
        "obs_float64": broken_array(lambda v: v.update(obs=v["obs"].astype(np.float64))),
        "actions_int64": broken_array(lambda v: v.update(actions=v["actions"].astype(np.int64))),
        "dones_bool": broken_array(lambda v: v.update(dones=v["dones"].astype(np.bool_))),
        "obs_short": broken_array(lambda v: v.update(obs=v["obs"][:, :-1])),
        "rows_disagree": broken_array(lambda v: v.update(values=v["values"][:-1])),
        "logprobs_nan": broken_array(set_one("logprobs", np.nan)),
        "values_inf": broken_array(set_one("values", np.inf)),
        "rewards_neg_inf": broken_array(set_one("rewards", -np.inf)),
        "bootstrap_nan": broken_array(set_one("bootstrap", np.nan)),
    }
    spec = sender.shape.spec
    hundred_of_500 = {"episode_returns": [500.0] * 100, "episode_lengths": [500] * 100,
                      "episode_stats": {name: [0.0] * 100 for name in spec.episode_stats}}
    semantic = {
        "rewards_1e30": broken_array(set_one("rewards", 1e30)),
        "values_1e30": broken_array(set_one("values", 1e30)),
        "bootstrap_1e30": broken_array(set_one("bootstrap", -1e30)),
        "logprobs_1e30": broken_array(set_one("logprobs", 1e30)),
        "dones_2": broken_array(set_one("dones", 2)), "dones_255": broken_array(set_one("dones", 255)),
        "masks_2": broken_array(set_one("action_masks", 2)) if sender.shape.layout.mask_size else None,
        "too_many_rows": lambda rng: genuine(rng, rows + 1),
        "no_rows": lambda rng: genuine(rng, 0),
        "env_steps_negative": fields_changed(env_steps=-1), "agent_steps_negative": fields_changed(agent_steps=-5),
        "env_steps_2e63": fields_changed(env_steps=BIG_INT64), "agent_steps_2e64": fields_changed(agent_steps=BIG_UINT64),
        "restarts_negative": fields_changed(env_restarts=-1),
        "returns_1e30": fields_changed(episode_returns=[1e30], episode_lengths=[5],
                                       episode_stats={name: [0.0] for name in spec.episode_stats}),
        "100_returns_of_500_in_1_step": fields_changed(env_steps=1, agent_steps=spec.num_agents, **hundred_of_500),
        "100_returns_of_500_in_0_agent_steps": fields_changed(agent_steps=0, **hundred_of_500),
        "lengths_2e63": fields_changed(episode_returns=[0.0], episode_lengths=[BIG_INT64],
                                       episode_stats={name: [0.0] for name in spec.episode_stats}),
    }
    if spec.action.kind != "box":
        high = int(np.max(spec.action.nvec))
        semantic.update({"actions_n": broken_array(set_one("actions", high)),
                         "actions_negative": broken_array(set_one("actions", -1)),
                         "actions_int32_max": broken_array(set_one("actions", INT32_MAX)),
                         "actions_int32_min": broken_array(set_one("actions", INT32_MIN))})
        floor = len(spec.action.nvec) * LOG_FLOAT32_TINY  # the least log-prob a policy over the space gives
        semantic.update({"logprobs_minus_1e6": broken_array(set_one("logprobs", -1e6)),
                         "logprobs_below_the_floor": broken_array(set_one("logprobs", min(-100.0, floor - 1.0))),
                         "logprobs_positive": broken_array(set_one("logprobs", 5.0))})  # a probability is <= 1
    if np.dtype(sender.shape.layout.obs_dtype).kind == "f":
        semantic.update({"obs_nan": broken_array(set_one("obs", np.nan)),
                         "obs_1e30": broken_array(set_one("obs", 1e30))})
    within_rules = {  # 100 episodes of 500 steps may end within the steps of one block when they began long before
        "100_returns_of_500": fields_changed(**hundred_of_500),
    }
    if spec.action.kind == "box":  # a Gaussian log-density may be > 0
        within_rules["logprobs_positive"] = broken_array(set_one("logprobs", 5.0))
    spoofed = {
        "token_absent": unregistered,
        "token_unknown": fields_changed(token=secrets.token_hex(16)),
        "token_empty": fields_changed(token=""),
        "token_long": fields_changed(token="a" * 100_000),
        "token_one_char_off": lambda rng: genuine(rng).with_fields(
            token=_one_char_off(sender.token or "0" * 32)),
    }
    versions = {
        "version_future": broken_array(set_values("versions", 10 ** 6), count=1),
        "version_2e62": broken_array(set_values("versions", 1 << 62), count=1),
        "version_negative": broken_array(set_values("versions", -1), count=1),
        "version_int64_min": broken_array(set_values("versions", -(1 << 63)), count=1),
    }
    return [
        *generic_classes(unregistered),
        HostileClass(name="field_mutation", variants=variants_of(field_mutations), outcome=Outcome.REJECTED),
        HostileClass(name="semantic", variants=variants_of({k: v for k, v in semantic.items() if v is not None}),
                     outcome=Outcome.REJECTED),
        HostileClass(name="within_rules", variants=variants_of(within_rules), outcome=Outcome.REPORTED, share=0.1),
        HostileClass(name="spoofed_token", variants=variants_of(spoofed), outcome=Outcome.REJECTED),
        HostileClass(name="bad_policy_version", variants=variants_of(versions), outcome=Outcome.DROPPED),
        HostileClass(name="genuine", variants=variants_of({"valid_rows": genuine}), outcome=Outcome.ACCEPTED,
                     share=0.02),
    ]


def _one_char_off(token: str) -> str:
    """``token`` with its last character changed."""
    return token[:-1] + ("0" if token[-1:] != "0" else "1")


# -- control socket --------------------------------------------------------------------------------------------

def control_classes(sender: RegisteredSender) -> list[HostileClass]:
    """Hostile control requests from an identity that never registered (so no corruption can make one valid)."""

    def heartbeat(rng: np.random.Generator) -> Parts:
        return _message(MessageType.HEARTBEAT)

    def register(**fields) -> Callable[[np.random.Generator], Parts]:
        return lambda rng: _message(MessageType.REGISTER).with_header(fields=fields)

    field_mutations = {
        "register_no_host": register(num_workers=1), "register_no_workers": register(host="fuzz"),
        "register_host_int": register(host=5, num_workers=1), "register_workers_str": register(host="f", num_workers="1"),
        "register_workers_bool": register(host="f", num_workers=True),
        "register_workers_float": register(host="f", num_workers=1.0),
        "heartbeat_env_error_str": lambda rng: heartbeat(rng).with_fields(env_error="boom"),
        "error_no_message": lambda rng: _message(MessageType.ERROR).with_fields(reason="x"),
    }
    unexpected = {
        "rows": lambda rng: parts_of(sender.rows_message(1, rng)),
        "weights": lambda rng: _message(MessageType.WEIGHTS, {"names": []}),
        "registered": lambda rng: _message(MessageType.REGISTERED, {"config": {}, "data_endpoint": "tcp://x:1",
                                                                    "weights_endpoint": "tcp://x:2", "run_id": "r"}),
        "error": lambda rng: _message(MessageType.ERROR, {"reason": "x", "message": "y"}),
        "shutdown": lambda rng: _message(MessageType.SHUTDOWN, {"reason": "fuzz"}),
        "heartbeat_ack": lambda rng: _message(MessageType.HEARTBEAT_ACK),
        "snapshot": lambda rng: _message(MessageType.SNAPSHOT, {"digest": "0" * 64}),
    }
    semantic = {f"register_workers_{n}": register(host="fuzz", num_workers=n)
                for n in (-1, 4097, INT32_MAX, BIG_INT64, BIG_UINT64)}  # 0 is valid: the run's num_workers
    spoofed = {
        "heartbeat_unregistered": heartbeat,
        "get_weights_unregistered": lambda rng: _message(MessageType.GET_WEIGHTS),
        "heartbeat_with_real_token": lambda rng: heartbeat(rng).with_fields(token=sender.token or ""),
        "heartbeat_unknown_token": lambda rng: heartbeat(rng).with_fields(token=secrets.token_hex(16)),
    }
    return [
        *generic_classes(heartbeat),
        HostileClass(name="field_mutation", variants=variants_of(field_mutations), outcome=Outcome.REJECTED),
        HostileClass(name="unexpected_type", variants=variants_of(unexpected), outcome=Outcome.REJECTED),
        HostileClass(name="semantic", variants=variants_of(semantic), outcome=Outcome.REJECTED),
        HostileClass(name="spoofed_identity", variants=variants_of(spoofed), outcome=Outcome.REJECTED),
        HostileClass(name="spoofed_bye", variants=variants_of({"bye_unregistered": lambda rng: _message(
            MessageType.BYE, {"reason": "fuzz"})}), outcome=Outcome.SILENT, share=0.1),
    ]


# -- opponent pool ---------------------------------------------------------------------------------------------

def pool_classes(*, standalone: bool) -> list[HostileClass]:
    """Hostile pool requests (on the standalone server, also every type it does not serve)."""

    def unknown_snapshot(rng: np.random.Generator) -> Parts:
        return _message(MessageType.GET_SNAPSHOT, {"digest": "0" * 64})

    def opponents(**fields) -> Callable[[np.random.Generator], Parts]:
        return lambda rng: _message(MessageType.GET_OPPONENTS).with_header(fields=fields)

    def snapshot(**fields) -> Callable[[np.random.Generator], Parts]:
        return lambda rng: _message(MessageType.GET_SNAPSHOT).with_header(fields=fields)

    field_mutations = {
        "num_envs_missing": opponents(), "num_envs_str": opponents(num_envs="8"),
        "num_envs_float": opponents(num_envs=8.0), "num_envs_bool": opponents(num_envs=True),
        "num_envs_list": opponents(num_envs=[8]), "digest_missing": snapshot(),
        "digest_int": snapshot(digest=5), "digest_list": snapshot(digest=["0" * 64]),
    }
    oversized = {f"num_envs_{n}": opponents(num_envs=n)
                 for n in (8193, 1 << 20, 1 << 31, BIG_INT64, BIG_UINT64, 0, -1, -(1 << 63))}
    digests = {"traversal": "../../../../etc/passwd", "unknown": "0" * 64, "not_hex": "g" * 64, "empty": "",
               "upper_hex": "A" * 64, "long": "0" * 200_000, "slash": "/", "nul": "\x00" * 64,
               "dots": "..", "index_json": "index"}
    classes = [
        *generic_classes(unknown_snapshot),
        HostileClass(name="field_mutation", variants=variants_of(field_mutations), outcome=Outcome.REJECTED),
        HostileClass(name="oversized", variants=variants_of(oversized), outcome=Outcome.REJECTED),
        HostileClass(name="bad_digest", variants=variants_of({name: snapshot(digest=d) for name, d in digests.items()}),
                     outcome=Outcome.REJECTED),
    ]
    if standalone:
        others = {kind.value: (lambda rng, k=kind: _message(k, _required_fields(k)))
                  for kind in (MessageType.HEARTBEAT, MessageType.GET_WEIGHTS, MessageType.BYE,
                               MessageType.REGISTER, MessageType.SHUTDOWN)}
        classes.append(HostileClass(name="unexpected_type", variants=variants_of(others), outcome=Outcome.REJECTED))
    return classes


def _required_fields(kind: MessageType) -> dict:
    return {MessageType.REGISTER: {"host": "fuzz", "num_workers": 1},
            MessageType.SHUTDOWN: {"reason": "fuzz"}}.get(kind, {})
