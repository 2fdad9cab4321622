"""Surface rewards: similarity to the reference, answer format, repetition, script consistency.

Each returns a score in [0, 1]; as a `reward.functions` entry with `min_score` it acts as a filter.
"""

from __future__ import annotations

import re
import unicodedata

from rapidfuzz.distance import Levenshtein

from grpo_aug.data.records import Prompt
from grpo_aug.errors import UsageError


class SimilarityReward:
    """1 - normalised Levenshtein distance to the reference solution (C-backed, rapidfuzz)."""

    name = "similarity"

    def __call__(self, prompt: Prompt, completion: str) -> float:
        return float(Levenshtein.normalized_similarity(completion.strip(), prompt.solution.strip()))


class FormatReward:
    """1.0 when the completion has a line matching `pattern` (default: a '#### N' answer line)."""

    name = "format"

    def __init__(self, pattern: str = r"^\s*####\s*-?\$?\d[\d,]*(?:\.\d+)?\s*$") -> None:
        try:
            self.pattern = re.compile(pattern, re.MULTILINE)
        except re.error as err:
            raise UsageError(f"reward format pattern {pattern!r} is not a valid regex: {err}") from err

    def __call__(self, prompt: Prompt, completion: str) -> float:
        return 1.0 if self.pattern.search(completion) else 0.0


class ThinkAnswerFormat:
    """R1-style format reward: 1.0 for reasoning in <think>...</think> followed by <answer>...</answer>.

    strict  the whole completion is `<think>...</think>` then `<answer>...</answer>`, only whitespace
            between and around them, each tag once
    soft    the four tags appear in that order somewhere (text around them allowed)
    Checked with plain string searches: linear in the completion's length, whatever it holds.
    """

    name = "think_answer"
    TAGS = ("<think>", "</think>", "<answer>", "</answer>")

    def __init__(self, mode: str = "strict") -> None:
        if mode not in ("strict", "soft"):
            raise UsageError(f"reward think_answer mode must be 'strict' or 'soft', got {mode!r}")
        self.mode = mode

    def __call__(self, prompt: Prompt, completion: str) -> float:
        if self.mode == "soft":
            at = 0
            for tag in self.TAGS:
                at = completion.find(tag, at)
                if at < 0:
                    return 0.0
                at += len(tag)
            return 1.0
        text = completion.strip()
        if not (text.startswith("<think>") and text.endswith("</answer>")):
            return 0.0
        if any(text.count(tag) != 1 for tag in self.TAGS):
            return 0.0
        end, start = text.find("</think>") + len("</think>"), text.find("<answer>")
        return 1.0 if end <= start and not text[end:start].strip() else 0.0


class RepetitionReward:
    """1 - the share of word n-grams that repeat an earlier n-gram of the same completion.

    'a b c a b c a b c' with n=3 has 7 trigrams, 3 distinct: score 3/7. Texts shorter than n
    words have nothing to repeat and score 1.
    """

    name = "repetition"

    def __init__(self, ngram: int = 3) -> None:
        if ngram < 1:
            raise UsageError(f"reward repetition ngram must be >= 1, got {ngram}")
        self.ngram = ngram

    def __call__(self, prompt: Prompt, completion: str) -> float:
        words = completion.split()
        # joined strings, not tuples: the garbage collector does not track strings, and a long
        # completion would otherwise trigger full collections
        grams = [" ".join(words[i : i + self.ngram]) for i in range(len(words) - self.ngram + 1)]
        if not grams:
            return 1.0
        return len(set(grams)) / len(grams)


# Unicode character-name prefixes of each script's letters
SCRIPTS = {"latin": ("LATIN",), "han": ("CJK",), "cyrillic": ("CYRILLIC",), "greek": ("GREEK",),
           "arabic": ("ARABIC",)}


class ScriptReward:
    """Share of letters written in the expected script; digits, spaces and punctuation are neutral.

    Catches language drift (a model that starts answering an English problem in another
    script). A completion without letters scores 1.
    """

    name = "script"

    def __init__(self, script: str = "latin") -> None:
        if script not in SCRIPTS:
            raise UsageError(f"reward script {script!r} is not one of {sorted(SCRIPTS)}")
        self.prefixes = SCRIPTS[script]

    def __call__(self, prompt: Prompt, completion: str) -> float:
        letters = [ch for ch in completion if unicodedata.category(ch).startswith("L")]
        if not letters:
            return 1.0
        inside = sum(1 for ch in letters if unicodedata.name(ch, "").startswith(self.prefixes))
        return inside / len(letters)
