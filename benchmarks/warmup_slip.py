"""Where the sloppy warm-up leaves each bucket: greedy answers on the held-out prompts, split into
correct, the planted slip (exactly one too high) and anything else.

    python benchmarks/warmup_slip.py outputs/cache/warmup-<key> [--seed 0]

70% of the demonstrations end one too high in every bucket, so a policy that learned a bucket's
demonstrations well answers it greedily with the slip; the start per bucket says how well the
warm-up learned each bucket's habit, not how hard the bucket is.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import torch

from grpo_aug.answers import AnswerFormat
from grpo_aug.data.synthetic import SyntheticArithmetic
from grpo_aug.models.loading import load_policy, load_tokenizer
from grpo_aug.prompts.datamodule import split_heldout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--per-bucket", type=int, default=200)
    args = parser.parse_args()
    # the default run's data and held-out split (conf/data/synthetic.yaml)
    records = SyntheticArithmetic(size_per_bucket=900, max_operand=99, seed=args.seed).load()
    _, heldout = split_heldout(records, args.per_bucket, args.seed)
    tokenizer, model = load_tokenizer(str(args.model)), load_policy(str(args.model)).eval()
    answers = AnswerFormat(markers=("hash", "boxed", "answer_is", "a_line"), fallback_last_number=True)  # answer=auto
    counts: dict[str, Counter] = {}
    for bucket in ("easy", "medium", "hard"):
        rows = [r for r in heldout if r.bucket == bucket]
        tokenizer.padding_side = "left"
        batch = tokenizer([r.prompt for r in rows], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.no_grad():
            out = model.generate(**batch, do_sample=False, max_new_tokens=64, pad_token_id=tokenizer.pad_token_id)
        texts = tokenizer.batch_decode(out[:, batch.input_ids.shape[1]:], skip_special_tokens=True)
        c = Counter()
        for r, text in zip(rows, texts, strict=True):
            stated = answers.extract(text)
            if answers.same(stated, r.answer):
                c["correct"] += 1
            elif answers.same(stated, str(int(r.answer) + 1)):
                c["slip (+1)"] += 1
            else:
                c["other"] += 1
        counts[bucket] = c
        print(bucket, {k: round(v / len(rows), 3) for k, v in sorted(c.items())})
    print(json.dumps({b: dict(c) for b, c in counts.items()}))


if __name__ == "__main__":
    main()
