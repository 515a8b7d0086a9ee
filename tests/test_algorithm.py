"""PPO behind the Algorithm interface: its updates are the loop's former ppo_update calls (schedules, minibatch
draws, reference refresh), and its state goes through a checkpoint in the same files as before."""

from __future__ import annotations

import math

import torch

from configs.plan import make_plan
from configs.schema import ModelSection
from learner.run.checkpoint import TrainerState, load_checkpoint, save_checkpoint
from learner.ppo.update import ppo_update
from learner.ppo.algorithm import PPO, make_optimizer, make_reference, zero_value_head
from learner.ppo.schedules import schedule_for
from policies.factory import make_policy
from tests.test_ppo import HORIZON, ROWS, SPEC, make_case, make_trainer

MODEL = ModelSection(hidden_size=8, num_layers=1)
SEED = 11
SEEDED_TRAINER = dict(minibatch_size=ROWS * HORIZON // 2, learning_rate=1e-2, total_timesteps=8 * ROWS * HORIZON,
                      update_epochs=2, kl_divergence_coef_rho=0.5, enable_ref_update=True, ref_update_interval=2,
                      vf_warmup=1, zero_initial_vf=True, optimizer="adamw", weight_decay=0.01)


def make_ppo(trainer, *, seed: int = 0, first_update: int = 0) -> PPO:
    torch.manual_seed(seed)
    return PPO(spec=SPEC, model=MODEL, trainer=trainer, plan=make_plan(trainer, num_agents=1),
               device=torch.device("cpu"), minibatch_seed=SEED + first_update)


def params(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in module.state_dict().items()}


def same_number(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_updates_are_the_former_loop_calls_of_ppo_update():
    trainer = make_trainer(**SEEDED_TRAINER)
    plan = make_plan(trainer, num_agents=1)
    _, batch, _ = make_case(3, logp_noise=0.25)
    ppo = make_ppo(trainer)

    torch.manual_seed(0)  # the learner as it was: policy, value head, optimizer, reference, generator
    policy = make_policy(SPEC, MODEL)
    zero_value_head(policy)
    optimizer = make_optimizer(policy, trainer)
    reference = make_reference(policy)
    generator = torch.Generator().manual_seed(SEED)
    for update in range(5):
        expected = ppo_update(policy, optimizer, batch, trainer=trainer, plan=plan,
                              schedule=schedule_for(trainer, update, plan.total_epochs), generator=generator,
                              reference=reference)
        if (update + 1) % trainer.ref_update_interval == 0:
            reference.load_state_dict(policy.state_dict())
        metrics = ppo.update(batch, update_index=update)
        assert 0.0 <= metrics.pop("first_layer_frozen_frac") <= 1.0  # the input health the algorithm adds
        assert metrics.keys() == expected.keys()
        assert all(same_number(metrics[k], expected[k]) for k in metrics), update
        assert_same(params(ppo.policy), params(policy))
        assert_same(params(ppo.reference), params(reference))
    assert metrics["vf_warmup"] == 0.0 and ppo.update(batch, update_index=0)["vf_warmup"] == 1.0


def test_state_goes_through_a_checkpoint_in_the_files_of_before(tmp_path):
    trainer = make_trainer(**SEEDED_TRAINER)
    _, batch, _ = make_case(4, logp_noise=0.25)
    trained = make_ppo(trainer)
    for update in range(3):
        trained.update(batch, update_index=update)
    path = save_checkpoint(tmp_path, learned=trained.state_dict(), state=TrainerState(update=3), keep=1)
    assert {p.name for p in path.iterdir()} == {"model.safetensors", "optimizer.safetensors", "optimizer.json",
                                                 "trainer_state.json", "reference.safetensors", "manifest.json"}

    checkpoint = load_checkpoint(path)
    assert checkpoint.trainer_state == TrainerState(update=3)
    resumed = make_ppo(trainer, seed=99)
    resumed.load_state_dict(checkpoint.learned)
    assert_same(params(resumed.policy), params(trained.policy))
    assert_same(params(resumed.reference), params(trained.reference))
    # the optimizer state came back too: the next update moves both alike (same minibatch draws)
    trained.generator.manual_seed(SEED + 3)
    resumed.generator.manual_seed(SEED + 3)
    trained.update(batch, update_index=3)
    resumed.update(batch, update_index=3)
    assert_same(params(resumed.policy), params(trained.policy))


def test_without_a_kl_penalty_there_is_no_reference_file_and_loading_keeps_the_given_reference(tmp_path):
    plain = make_ppo(make_trainer(**{**SEEDED_TRAINER, "kl_divergence_coef_rho": 0.0}))
    assert plain.reference is None
    path = save_checkpoint(tmp_path, learned=plain.state_dict(), state=TrainerState(), keep=1)
    assert not (path / "reference.safetensors").exists()
    with_kl = make_ppo(make_trainer(**SEEDED_TRAINER), seed=5)
    initial_reference = params(with_kl.reference)
    with_kl.load_state_dict(load_checkpoint(path).learned)
    assert_same(params(with_kl.policy), params(plain.policy))
    assert_same(params(with_kl.reference), initial_reference)
