"""ops.bench.fixed_costs' least-squares fit against an independent NumPy solution of the normal equations, on
random inputs; its refusals. (The sweep itself runs in tests/test_bench.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from ops.bench.fixed_costs import fit_costs


def _normal_equations(group: np.ndarray, message: np.ndarray, cpu: np.ndarray) -> np.ndarray:
    """[marginal, fixed_group, fixed_message] from (X^T X) b = X^T y, X's columns written out by hand."""
    x = np.column_stack([np.ones(len(group)), 1.0 / group, 1.0 / message])
    return np.linalg.solve(x.T @ x, x.T @ cpu)


@pytest.mark.parametrize("seed", range(5))
def test_fit_matches_the_normal_equations_on_noisy_runs(seed: int) -> None:
    rng = np.random.default_rng(seed)
    group = rng.choice([32.0, 128.0, 252.0, 512.0], size=9)
    message = rng.choice([500.0, 1000.0, 4000.0, 8000.0], size=9)
    group[:2], message[:2] = (32.0, 512.0), (500.0, 8000.0)  # two sizes of each at least
    cpu = 0.3 + 80.0 / group + 400.0 / message + rng.normal(0.0, 0.05, size=9)
    fitted = fit_costs(group, message, cpu)
    marginal, fixed_group, fixed_message = _normal_equations(group, message, cpu)
    assert fitted["marginal_us_per_agent_step"] == pytest.approx(marginal, rel=1e-9, abs=1e-9)
    assert fitted["fixed_us_per_group"] == pytest.approx(fixed_group, rel=1e-9)
    assert fitted["fixed_us_per_message"] == pytest.approx(fixed_message, rel=1e-9)
    residual = cpu - (marginal + fixed_group / group + fixed_message / message)
    assert fitted["rms_residual_us"] == pytest.approx(np.sqrt(np.mean(residual ** 2)), rel=1e-9, abs=1e-12)


def test_exact_runs_give_back_their_costs_with_no_residual() -> None:
    group = np.array([32.0, 32.0, 512.0, 512.0])
    message = np.array([512.0, 8192.0, 512.0, 8192.0])
    fitted = fit_costs(group, message, 0.25 + 90.0 / group + 370.0 / message)
    assert fitted["marginal_us_per_agent_step"] == pytest.approx(0.25)
    assert fitted["fixed_us_per_group"] == pytest.approx(90.0)
    assert fitted["fixed_us_per_message"] == pytest.approx(370.0)
    assert fitted["rms_residual_us"] == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize(("group", "message", "cpu", "error"), [
    ([32, 32, 32], [512, 1024, 512], [1.0, 1.0, 1.0], "two group sizes and two message sizes"),
    ([32, 64, 128], [512, 512, 512], [1.0, 1.0, 1.0], "two group sizes and two message sizes"),
    ([32, 64], [512, 1024, 2048], [1.0, 1.0], "one figure per run"),
    ([0, 64, 128], [512, 1024, 2048], [1.0, 1.0, 1.0], "must be positive"),
])
def test_fit_refuses_runs_it_cannot_fit(group, message, cpu, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        fit_costs(np.array(group), np.array(message), np.array(cpu))
