"""Every override the README and the comments in conf/ show composes as written: each
`python train.py ...` command (continuation lines joined), and each `group/option=...` or
`top.level.key=...` example written inline in a conf/ comment. Placeholders (`<hub id>`, `...`)
stand for the user's value; `[...]` marks an optional part, composed too; `a|b` lists options,
each composed. Composing checks what Hydra checks: the groups and options exist, the keys exist
(struct mode), the values parse."""

from __future__ import annotations

import re
import shlex

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException

from helpers import ROOT

GENERIC = {"group=option", "key=value"}  # `python train.py [group=option ...] [key=value ...]`
PLACEHOLDER = re.compile(r"<[^<>]*>")
COMMAND = re.compile(r"(?:python\s+|torchrun\b.*?\s)train\.py\b(.*)")
QUOTED = re.compile(r"'([a-z_]+(?:[./][a-z_0-9]+)*=[^']+)'")  # 'key=value with spaces'
INLINE = re.compile(r"(?<![\w.'\"/=-])([a-z_]+(?:[./][a-z_0-9]+)*=[^\s,;)'\"]+)")


def _args(text: str) -> list[str]:
    """The overrides of one command line (after train.py), placeholders filled, options unbracketed."""
    text = PLACEHOLDER.sub("PLACEHOLDER", text)
    out = []
    for arg in shlex.split(text, comments=True):
        if arg.startswith("[") and "=" in arg:  # an optional part, [key=value]
            arg = arg[1:].removesuffix("]")
        elif arg.endswith("]") and "=[" not in arg and "=" in arg and arg.count("[") < arg.count("]"):
            arg = arg[:-1]
        if "=" not in arg or arg.startswith("hydra.") or "=..." in arg or "$" in arg or arg in GENERIC:
            continue  # hydra's own settings, "more of your choice", shell variables, the syntax itself
        out.append(arg)
    return out


def _commands(lines: list[str], where: str) -> list[tuple[str, list[str]]]:
    found, joined, start = [], "", 0
    for i, line in enumerate(lines):
        if not joined:
            start = i + 1
        joined += line.rstrip().removesuffix("\\") + " "
        if line.rstrip().endswith("\\"):
            continue
        match = COMMAND.search(joined)
        if match:  # "train.py a=1  |  'b=[x,y]'": two ways of writing it, each a command
            found += [(f"{where}:{start}", _args(alternative)) for alternative in re.split(r"\s\|\s", match.group(1))]
        joined = ""
    return found


def readme_examples() -> list[tuple[str, list[str]]]:
    """The commands of the README's bash blocks; every other line blanked, so line numbers hold."""
    kept, in_block, bash = [], False, False
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("```"):
            in_block, bash = not in_block, line.strip() == "```bash"
            kept.append("")
        else:
            kept.append(line if in_block and bash else "")
    return _commands(kept, "README.md")


def conf_examples() -> list[tuple[str, list[str]]]:
    examples = []
    top = {line.split(":")[0].strip(" -") for line in (ROOT / "conf" / "train.yaml").read_text().splitlines()
           if re.match(r"^(  - )?[a-z_]+:", line)}
    for path in sorted((ROOT / "conf").rglob("*.yaml")):
        where = str(path.relative_to(ROOT))
        comments = [line.split("#", 1)[1] if "#" in line else "" for line in path.read_text().splitlines()]
        examples += _commands(comments, where)
        for i, comment in enumerate(comments, 1):
            if COMMAND.search(comment) or (i > 1 and comments[i - 2].rstrip().endswith("\\")):
                continue
            tokens = QUOTED.findall(comment)
            for token in INLINE.findall(QUOTED.sub("", comment)):
                key = re.split(r"[./=]", token, maxsplit=1)[0]
                if re.search(r"[./][a-z_0-9]+=", token) or key in top:
                    tokens.append(token)
            for token in tokens:
                token = token.rstrip(":;")  # the sentence's punctuation
                token = token[:-1] if token.endswith(".") and not token.endswith("...") else token
                if token.startswith("hydra.") or token in GENERIC or token.endswith("=..."):
                    continue  # "data=...": any of them
                key, _, value = PLACEHOLDER.sub("PLACEHOLDER", token).partition("=")
                options = value.split("|") if "{" not in value else [value]
                examples += [(f"{where}:{i}", [f"{key}={option}"]) for option in options]
    return examples


EXAMPLES = readme_examples() + conf_examples()


def test_the_collection_finds_the_examples():
    # a parser that silently finds nothing would pass every composition below
    where = {w.split(":")[0] for w, _ in EXAMPLES}
    assert "README.md" in where and "conf/data/synthetic.yaml" in where and "conf/model/tiny.yaml" in where
    assert any(args == ["data.source.tiers={hard: {ops: \"+-*\", operand: null}}"] for _, args in EXAMPLES)
    assert any("experiment=gsm8k_qwen2.5_0.5b_instruct" in args for _, args in EXAMPLES)
    assert len(EXAMPLES) > 30


@pytest.mark.parametrize("where,overrides", EXAMPLES, ids=[f"{w} {' '.join(a)}"[:90] for w, a in EXAMPLES])
def test_documented_override_composes(where, overrides):
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        try:
            compose(config_name="train", overrides=overrides)
        except (HydraException, OmegaConfBaseException) as err:
            pytest.fail(f"{where}: {overrides} does not compose: {err}")
