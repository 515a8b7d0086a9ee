"""selfplay.baseline_opponents: fixed baselines mixed into each env's opponent draw. The draw against a NumPy
reference, the pool server's answers, the actor host playing a baseline without a download, bad names from the
server, and the config errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from actors.alternation import OpponentAlternation
from actors.opponents import OpponentAssignment, OpponentCache, Opponents, opponent_for
from actors.pool_client import PoolError
from configs.baselines import BASELINE_DIGEST_PREFIX
from configs.loader import ConfigError, load_config
from configs.schema import ModelSection, SelfPlaySection
from envs.builtin.connect_four.game import ConnectFourVec
from evaluation.arena import NegamaxPlayer, OnePlyPlayer, RandomPlayer
from learner.pool.store import SnapshotStore, sample_baselines
from learner.pool.server import PoolService
from policies.factory import make_policy, state_arrays
from protocol import Message, MessageType

SPEC = ConnectFourVec.SPEC
MODEL = ModelSection(hidden_size=16, num_layers=1)


def reference_baselines(uniforms: np.ndarray, chances: list[float]) -> np.ndarray:
    """Independent reference: walk the chances until the uniform falls inside one; past them all = the pool."""
    picks = np.full(len(uniforms), len(chances), dtype=np.int64)
    for k, u in enumerate(uniforms):
        low = 0.0
        for j, chance in enumerate(chances):
            if low <= u < low + chance:
                picks[k] = j
                break
            low += chance
    return picks


@pytest.mark.parametrize("chances", [[], [0.25], [0.1, 0.3], [0.5, 0.5], [1.0], [0.2, 0.0, 0.3]])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sample_baselines_matches_the_reference(chances, seed):
    picks = sample_baselines(5000, chances, rng=np.random.default_rng(seed))
    uniforms = np.random.default_rng(seed).random(5000)
    assert picks.dtype == np.int64 and picks.tolist() == reference_baselines(uniforms, chances).tolist()
    expected = [*chances, 1 - sum(chances)]
    observed = np.bincount(picks, minlength=len(chances) + 1) / 5000
    assert np.allclose(observed, expected, atol=0.03)


@pytest.mark.parametrize("chances", [[0.7, 0.4], [-0.1, 0.5]])
def test_sample_baselines_refuses_impossible_chances(chances):
    with pytest.raises(ValueError, match="at most 1"):
        sample_baselines(3, chances, rng=np.random.default_rng(0))


def pool_service(tmp_path, mix: dict[str, float], seed: int = 0) -> PoolService:
    store = SnapshotStore(tmp_path / "pool")
    for k in range(6):
        torch.manual_seed(k)
        store.add(state_arrays(make_policy(SPEC, MODEL)), update=10 * k, policy_version=10 * k)
    return PoolService(store, SelfPlaySection(enabled=True, baseline_opponents=mix), seed=seed)


def assignment(service: PoolService, num_envs: int) -> tuple[list[str], list[int]]:
    reply = service.handle(Message(type=MessageType.GET_OPPONENTS, sender="test", fields={"num_envs": num_envs}))
    positions = reply.arrays["env_opponent"].tolist()
    return ([reply.fields["digests"][p] for p in positions], [reply.fields["indices"][p] for p in positions])


def test_pool_server_mixes_baselines_at_their_chances(tmp_path):
    service = pool_service(tmp_path, {"one_ply": 0.3, "random": 0.1})
    digests, indices = assignment(service, 8000)
    share = {name: digests.count(BASELINE_DIGEST_PREFIX + name) / 8000 for name in ("one_ply", "random")}
    assert share == pytest.approx({"one_ply": 0.3, "random": 0.1}, abs=0.03)
    for digest, index in zip(digests, indices):
        if digest.startswith(BASELINE_DIGEST_PREFIX):
            assert index == -1  # not a pool index
        else:
            assert service.store.snapshot(index).hash == digest


def test_pool_server_without_baselines_draws_exactly_as_before(tmp_path):
    """An empty mix adds no rng draw: the answers are the pure self-play ones (same seed, same snapshots)."""
    plain = pool_service(tmp_path / "a", {}, seed=3)
    store = plain.store
    reference = PoolService(store, SelfPlaySection(enabled=True), seed=3)
    for _ in range(3):
        assert assignment(plain, 64) == assignment(reference, 64)
    assert not any(d.startswith(BASELINE_DIGEST_PREFIX) for d in assignment(plain, 500)[0])


class NoDownloads:
    def __call__(self, digest: str) -> bytes:
        raise AssertionError(f"downloaded {digest}")


def test_actor_host_plays_a_baseline_opponent_without_downloading():
    cache = OpponentCache(SPEC, MODEL, capacity=4, fetch=NoDownloads(), seed=0)
    opponents = Opponents(num_envs=2, num_agents=2, cache=cache)
    opponents.assign(OpponentAssignment(alternation=1, digests=("baseline:one_ply", "baseline:negamax-2"),
                                        indices=(-1, -1)))
    assert isinstance(cache["baseline:one_ply"], OnePlyPlayer) and cache.downloads == 0
    assert isinstance(cache["baseline:negamax-2"], NegamaxPlayer) and cache["baseline:negamax-2"].depth == 2
    # both envs: seat 1's opponent to move with three of its stones in column 5, the winning square open
    obs = np.zeros((2, *SPEC.obs_shape), dtype=SPEC.obs_dtype)
    obs[:, 0, 3:6, 5] = 255  # plane 0: the mover's stones (row 0 is the top)
    obs[:, 1, 5, 0:2] = 255  # plane 1: the other player's
    masks = np.ones((2, SPEC.mask_size), dtype=np.uint8)
    actions = opponents.act(np.array([1, 3]), obs, masks)
    assert actions.tolist() == [5, 5]  # one-ply and negamax both take the win


def test_a_baseline_this_host_cannot_play_is_refused_and_the_current_opponents_stay():
    with pytest.raises(ValueError, match="cannot play.*unknown baseline 'two_ply'"):
        opponent_for("baseline:two_ply", build_snapshot=lambda digest: None, seed=0)
    assert isinstance(opponent_for("baseline:random", build_snapshot=lambda digest: None, seed=0), RandomPlayer)

    class Client:
        answers = [OpponentAssignment(alternation=1, digests=("baseline:one_ply",) * 2, indices=(-1, -1)),
                   OpponentAssignment(alternation=2, digests=("baseline:bogus",) * 2, indices=(-1, -1))]

        def opponents(self, num_envs: int) -> OpponentAssignment:
            if not self.answers:
                raise PoolError("gone")
            return self.answers.pop(0)

    opponents = Opponents(num_envs=2, num_agents=2, cache=OpponentCache(SPEC, MODEL, capacity=4, fetch=NoDownloads(),
                                                                       seed=0))
    alternation = OpponentAlternation(client=Client(), opponents=opponents, steps_per_alternation=10)
    alternation.maybe_next(10)  # the bad name: logged, the host keeps its opponents
    alternation.maybe_next(20)  # the server is gone: the same
    assert opponents.env_digests.tolist() == ["baseline:one_ply"] * 2


@pytest.mark.parametrize("setting, message", [
    ("{two_ply: 0.2}", "selfplay.baseline_opponents: unknown baseline 'two_ply'; allowed: random, one_ply, "
                       "negamax-<depth>"),
    ("{one_ply: 0}", "selfplay.baseline_opponents.one_ply: the chance an env draws it must be a number in (0, 1], "
                     "got 0"),
    ("{one_ply: 1.5}", "must be a number in (0, 1], got 1.5"),
    ("{one_ply: yes}", "must be a number in (0, 1], got True"),
    ("{one_ply: 0.6, random: 0.5}", "selfplay.baseline_opponents: the chances add up to 1.1, more than 1"),
])
def test_baseline_opponents_config_errors_name_the_key(setting, message):
    with pytest.raises(ConfigError) as err:
        load_config("configs/selfplay_connect4.yaml", [f"selfplay.baseline_opponents={setting}"])
    assert message in str(err.value)


def test_baseline_opponents_need_an_env_with_baselines():
    with pytest.raises(ConfigError) as err:
        load_config("configs/grid_3agents.yaml", ["selfplay.enabled=true", "selfplay.baseline_opponents={one_ply: 0.2}"])
    assert "selfplay.baseline_opponents needs an env with baselines; env.name 'gridworld' has none" in str(err.value)


def test_the_shipped_connect4_config_mixes_one_ply_and_keeps_the_best_against_one_ply_and_negamax_4():
    config = load_config("configs/selfplay_connect4.yaml")
    assert config.selfplay.baseline_opponents == {"one_ply": 0.4}
    assert config.evaluation.baselines == ["one_ply", "negamax-4"] and config.evaluation.interval_updates > 0
    assert load_config(None).selfplay.baseline_opponents == {}  # the seed's pure self-play by default
