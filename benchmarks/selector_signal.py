"""How well the policy's likelihood of a reference solution tells flat groups apart, on prompts
the policy may never have seen (prints one line per bucket).

    python benchmarks/selector_signal.py outputs/grpo/<run>/policy --seed 1

For N training prompts per bucket of the default synthetic task (seed as in the run): roll out a
group of G = 8 at the default temperature ladder, score the exact answers, and measure
log p(reference solution | prompt) with `grpo_aug.prompts.likelihood.reference_logprobs`. Prints
the share of all-right, all-wrong and mixed groups, and the AUC of the log-probability for
"all right" against the rest (0.5: no signal; 1: a perfect ranking).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from grpo_aug.data.synthetic import SyntheticArithmetic  # noqa: E402
from grpo_aug.engines.sampling import generate  # noqa: E402
from grpo_aug.preflight import pair_auc  # noqa: E402
from grpo_aug.prompts.datamodule import split_heldout  # noqa: E402
from grpo_aug.prompts.likelihood import reference_logprobs  # noqa: E402
from grpo_aug.rewards import MathReward  # noqa: E402


def auc(positive: list[float], negative: list[float]) -> float:
    """P(a positive scores above a negative), ties counting half (preflight's pair rule)."""
    return statistics.mean(s for p in positive for s in pair_auc(p, negative))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("policy", type=Path, help="a saved policy directory (a run's policy/)")
    parser.add_argument("--seed", type=int, default=0, help="the run's seed: which synthetic problems")
    parser.add_argument("--per-bucket", type=int, default=320)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args()
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(args.policy)
    model = AutoModelForCausalLM.from_pretrained(args.policy).eval()
    train, _ = split_heldout(SyntheticArithmetic(seed=args.seed).load(), 200, args.seed)
    reward, G = MathReward(), 8
    temperatures = torch.tensor([0.7, 1.0, 1.2, 1.5] * (G // 4))
    for bucket in ("easy", "medium", "hard"):
        pool = [r for r in train if r.bucket == bucket]
        random.Random(0).shuffle(pool)
        scored = []  # (log p(reference), pass rate)
        for i in range(0, args.per_bucket, 16):
            batch = pool[i : i + 16]
            logps = reference_logprobs(model, tokenizer, [r.prompt for r in batch], [r.solution for r in batch],
                                       args.max_new_tokens)
            ro = generate(model, tokenizer, [r.prompt for r in batch for _ in range(G)],
                          temperatures.repeat(len(batch)), 0.95, args.max_new_tokens,
                          generator=torch.Generator().manual_seed(i))
            for j, r in enumerate(batch):
                rate = sum(reward(r, t) for t in ro.texts[j * G : (j + 1) * G]) / G
                scored.append((logps[j], rate))
        right = [lp for lp, rate in scored if rate == 1.0]
        wrong = [lp for lp, rate in scored if rate == 0.0]
        rest = [lp for lp, rate in scored if rate < 1.0]
        n = len(scored)
        separation = f"{auc(right, rest):.3f}" if right and rest else "n/a (one class only)"
        print(f"{bucket}: {n} prompts, all right {len(right) / n:.2f}, all wrong {len(wrong) / n:.2f}, "
              f"mixed {(n - len(right) - len(wrong)) / n:.2f}; AUC of log p(reference), all right vs rest: "
              f"{separation}")


if __name__ == "__main__":
    main()
