"""Value-target normalisation (``trainer.norm_value_targets``): a running mean and variance of the returns.

With it on, the value head predicts returns in normalised units, ``v_norm = (G - mean) / sqrt(var + eps)``.
The update (learner/ppo/update.py) then:

1. denormalises the behaviour values and truncation bootstraps the actors sent (``V = mean + sqrt(var + eps) *
   v_norm``, with the statistics as they stand *before* this update; a bootstrap of exactly 0 means "no
   bootstrap" in a row, so it stays 0) and computes GAE and the returns ``G = A + V`` in the returns' own units;
2. merges this batch's returns into the statistics (Chan et al.'s parallel update of count, mean and M2);
3. normalises the returns and the behaviour values with the *updated* statistics, so the value loss (the seed's
   clipping included: ``vf_clip_coef`` is then in normalised units) compares the head's output with targets in
   the space it predicts.

The statistics (``policies.running_stats.RunningMeanStd``, shape ``()``) are float64 buffers of an ``nn.Module``, so
they go through the checkpoint's safetensors path like any module (file ``value_normalizer.safetensors``). Rows acted
under older statistics are denormalised with the current ones: the statistics move slowly, and rows are at most
``max_policy_lag`` versions old.
"""

from __future__ import annotations

from policies.running_stats import VARIANCE_EPSILON, RunningMeanStd

__all__ = ["VARIANCE_EPSILON", "RunningMeanStd"]
