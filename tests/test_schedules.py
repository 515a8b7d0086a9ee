"""Every schedule of seeds/000 (and seeds/003's linear LR) at progress 0, 0.5 and 1, against formulas
written out here from the seed text."""

from __future__ import annotations

import math

import pytest

from configs.schema import TrainerSection
from learner.ppo.schedules import schedule_for, scheduled

TOTAL = 200
POINTS = [(0, 0.0), (100, 0.5), (200, 1.0)]


def seed_formula(kind: str, initial: float, minimum: float, progress: float, decay: float = 0.1) -> float:
    if kind == "constant":
        return initial
    if kind == "cosine":
        return minimum + 0.5 * (initial - minimum) * (1 + math.cos(math.pi * progress))
    if kind == "linear":
        return initial - (initial - minimum) * progress
    return max(minimum, initial * math.exp(-decay * progress))


@pytest.mark.parametrize("kind", ["constant", "cosine", "linear", "logarithmic"])
@pytest.mark.parametrize("epoch, progress", POINTS)
def test_every_schedule_for_every_hyperparameter(kind, epoch, progress):
    trainer = TrainerSection(lr_schedule=kind, ent_coef_schedule=kind, clip_coef_schedule=kind,
                             learning_rate=0.000457, min_learning_rate=0.00003, ent_coef=0.0021, min_ent_coef=0.0,
                             clip_coef=0.1, min_clip_coef=0.05, log_schedule_decay=0.1)
    s = schedule_for(trainer, epoch, TOTAL)
    assert s.learning_rate == pytest.approx(seed_formula(kind, 0.000457, 0.00003, progress), rel=1e-12)
    assert s.ent_coef == pytest.approx(seed_formula(kind, 0.0021, 0.0, progress), rel=1e-12, abs=1e-15)
    assert s.clip_coef == pytest.approx(seed_formula(kind, 0.1, 0.05, progress), rel=1e-12)


def test_seed_defaults_cosine_lr_linear_entropy_logarithmic_clip():
    trainer = TrainerSection()  # the seeds/000 defaults
    start, middle, end = (schedule_for(trainer, e, TOTAL) for e in (0, 100, 200))
    assert (start.learning_rate, middle.learning_rate, end.learning_rate) == pytest.approx(
        (0.000457, (0.000457 + 0.00003) / 2, 0.00003))
    assert (start.ent_coef, middle.ent_coef, end.ent_coef) == pytest.approx((0.0021, 0.00105, 0.0))
    assert (start.clip_coef, middle.clip_coef, end.clip_coef) == pytest.approx(
        (0.1, 0.1 * math.exp(-0.05), 0.1 * math.exp(-0.1)))


def test_logarithmic_floor_applies():
    assert scheduled("logarithmic", 0.1, 0.095, 1.0, decay_rate=0.1) == 0.095  # 0.1 e^-0.1 = 0.0905 < floor
    assert scheduled("logarithmic", 1.0, 0.0, 1.0, decay_rate=2.0) == pytest.approx(math.exp(-2.0))


def test_progress_is_clamped_past_the_end():
    for kind in ("cosine", "linear", "logarithmic"):
        assert scheduled(kind, 1.0, 0.1, 1.7, decay_rate=0.1) == scheduled(kind, 1.0, 0.1, 1.0, decay_rate=0.1)
    trainer = TrainerSection(prio_alpha=1.0, prio_beta0=0.6)
    assert schedule_for(trainer, 500, TOTAL).anneal_beta == pytest.approx(1.0)


@pytest.mark.parametrize("epoch", [0, 1, 7, 50])
def test_kl_coefficient_decays_per_update(epoch):
    trainer = TrainerSection(kl_divergence_coef_rho=0.2, coef_rho_decay=0.9)
    assert schedule_for(trainer, epoch, TOTAL).kl_coef == pytest.approx(0.2 * 0.9 ** epoch, rel=1e-12)
    assert schedule_for(TrainerSection(), epoch, TOTAL).kl_coef == 0.0


def test_vf_warmup_covers_exactly_the_first_updates():
    trainer = TrainerSection(vf_warmup=3)
    assert [schedule_for(trainer, e, TOTAL).vf_warmup for e in range(5)] == [True, True, True, False, False]
    assert not schedule_for(TrainerSection(), 0, TOTAL).vf_warmup


def test_as_metrics_names_every_scheduled_value():
    metrics = schedule_for(TrainerSection(vf_warmup=1), 0, TOTAL).as_metrics()
    assert set(metrics) == {"learning_rate", "ent_coef", "clip_coef", "anneal_beta", "kl_coef", "vf_warmup"}
    assert metrics["vf_warmup"] == 1.0
