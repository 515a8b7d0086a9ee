"""metrics.jsonl (one JSON object per update) and the console progress line."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsLog:
    """Appends one JSON line per update and prints a short progress line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = path.open("a", buffering=1)

    def write(self, record: dict[str, Any]) -> None:
        """Log one update."""
        self.file.write(json.dumps({k: _clean(v) for k, v in record.items()}) + "\n")
        ret = record.get("episode_return_mean")
        ret_text = "   n/a" if ret is None else f"{ret:6.1f}"
        if record.get("win_rate") is not None:  # self-play: against the pool, over the last 100 episodes
            ret_text += (f" | win/draw/loss {record['win_rate']:.2f}/{record['draw_rate']:.2f}/"
                         f"{record['loss_rate']:.2f} pool {record['pool_snapshots']}")
        print(f"update {record['update']:5d} | agent steps {record['agent_steps']:>11,} | sps {record['sps']:8,.0f} | "
              f"return {ret_text} | lag {record['policy_lag_mean']:.2f} | "
              f"pg {record['policy_loss']:+.3f} v {record['value_loss']:.3f} ent {record['entropy']:.3f} "
              f"kl {record['approx_kl']:.4f} clip {record['clipfrac']:.3f} "
              f"ev {_clean(record['explained_variance']) or 0.0:+.2f}", flush=True)

    def close(self) -> None:
        """Flush and close."""
        self.file.close()
