"""Feed hostile completions through the evaluator and every shipped reward.

    python scripts/fuzz_rewards.py                 # 100,000 cases, seed 1
    python scripts/fuzz_rewards.py --cases 10000 --seed 0

Prints the slowest call of each function (thread CPU time) and every escape; exits 1 on an
escape or a call over the budget (50 ms). The fast test suite runs 10,000 cases, the slow one
the full 100,000.
"""

from __future__ import annotations

import argparse
import sys
import time

from grpo_aug.rewards import fuzz


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--budget-ms", type=float, default=50.0)
    args = parser.parse_args()
    start = time.monotonic()
    report = fuzz.run(fuzz.cases(args.cases, args.seed))
    print(f"{args.cases} cases, {report.calls} calls in {time.monotonic() - start:.1f} s")
    for name, (seconds, text) in sorted(report.slowest.items()):
        print(f"  {name:<15} slowest {seconds * 1000:7.2f} ms  on {text[:50]!r}")
    for name, error, text in report.escapes[:20]:
        print(f"ESCAPE {name}: {error} on {text!r}")
    over = [n for n, (s, _) in report.slowest.items() if s * 1000 > args.budget_ms]
    if over:
        print(f"over the {args.budget_ms:g} ms budget: {over}")
    return 1 if report.escapes or over else 0


if __name__ == "__main__":
    sys.exit(main())
