"""How often a policy finishes a problem from a start inside its reference solution
(rollout/reflect=prefix): the pass rate of rows sampled after the reference's first lines, by
bucket and by the steps left to write, against no prefix at all.

    python benchmarks/guided_rows.py <policy dir, e.g. outputs/cache/warmup-...> [--n 64] [--seed 0]

Prints one line per bucket and number of steps left: rows, pass rate at temperature 1.0 and greedy.
A prefix that lifts an all-wrong bucket's pass rate above 0 is what makes its groups informative.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from grpo_aug.answers import AUTO  # noqa: E402
from grpo_aug.data.synthetic import SyntheticArithmetic  # noqa: E402
from grpo_aug.engines.sampling import generate  # noqa: E402
from grpo_aug.models.loading import load_policy, load_tokenizer  # noqa: E402
from grpo_aug.rollout.reference_prefix import prefix_text  # noqa: E402


def pass_rate(model, tokenizer, rows: list[tuple[str, str, str]], temperature: float, max_new_tokens: int) -> float:
    """rows: (context, given prefix, answer); a row passes when prefix + completion states the answer."""
    torch.manual_seed(0)
    ro = generate(model, tokenizer, [c for c, _, _ in rows], torch.full((len(rows),), temperature), 1.0,
                  max_new_tokens)
    return sum(AUTO.correct(given + text, answer)
               for (_, given, answer), text in zip(rows, ro.texts, strict=True)) / len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("policy", type=Path)
    parser.add_argument("--n", type=int, default=64, help="training prompts per bucket")
    parser.add_argument("--seed", type=int, default=0, help="the data seed (the run's seed)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    tokenizer, model = load_tokenizer(str(args.policy)), load_policy(str(args.policy)).eval()
    records = SyntheticArithmetic(seed=args.seed).load()
    print("bucket | steps left | rows | pass rate T=1.0 | greedy")
    for bucket in ("medium", "hard"):
        prompts = [r for r in records if r.bucket == bucket][: args.n]
        for left in (None, 2, 1):  # None: no prefix, the policy alone
            rows = []
            for p in prompts:
                given = "" if left is None else prefix_text(p.solution, left)
                if given is not None:
                    rows.append((p.prompt + given, given, p.answer))
            if not rows:
                continue
            sampled = pass_rate(model, tokenizer, rows, 1.0, args.max_new_tokens)
            greedy = pass_rate(model, tokenizer, rows, 1e-4, args.max_new_tokens)
            print(f"{bucket} | {'all' if left is None else left} | {len(rows)} | {sampled:.3f} | {greedy:.3f}")


if __name__ == "__main__":
    main()
