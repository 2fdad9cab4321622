"""Plot a run's first page (grpo_aug.dashboard.CHARTS) from its TensorBoard event files into one PNG.

    python scripts/plot_health.py outputs/grpo/<run> [out.png]

A run writes <run>/health.png itself when it ends; this redraws it (or draws one for a run still
going). Reads the events with TensorBoard's own reader; no TensorBoard server needed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpo_aug.dashboard import plot_health

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        raise SystemExit(__doc__)
    run_dir = Path(sys.argv[1])
    try:
        print(plot_health(run_dir, Path(sys.argv[2]) if len(sys.argv) > 2 else run_dir / "health.png"))
    except FileNotFoundError as err:
        raise SystemExit(str(err)) from None
