"""How a prompt record is presented to the model (`data/prompt_format=plain|chat`).

    plain  the record's prompt text as it is (`Q: ...\nA: `), for base models
    chat   the record's prompt text becomes the user message of the tokenizer's own chat template,
           after the row's earlier messages (conversational datasets) or an optional system
           prompt, with the generation prompt added (instruct models). A system message in the
           data wins over `system_prompt`. `examples` are worked examples written as earlier
           turns (few-shot): a user message and the assistant's answer each, after the system
           message and before the row's own messages; they show an instruct model the form of
           the working, which a system prompt alone does not (docs/real-model.md).
Method hints and variants change the record's text, so they stay inside the user message. The
template is rendered once per distinct text and context, so a group's G rows still share one
prompt and one prefill.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from transformers import PreTrainedTokenizerBase

from grpo_aug.data.records import Prompt
from grpo_aug.errors import UsageError

MAX_RENDERED = 100_000  # rendered prompts kept for reuse
Context = tuple[tuple[str, str], ...] | None  # (role, content) messages before the user's text; None: a text prompt


class PlainPrompt:
    def bind(self, tokenizer: PreTrainedTokenizerBase, where: str = "") -> PlainPrompt:
        return self

    def conversation(self, record: Prompt) -> None:
        """The messages the model sees, for rewards that read them: none, it sees text."""
        return None

    def __call__(self, texts: Sequence[str], contexts: Sequence[Context] | None = None) -> list[str]:
        if contexts is not None and any(c is not None for c in contexts):
            raise UsageError("the dataset's prompts are conversations (lists of {role, content} messages): render "
                             "them with data/prompt_format=chat (a model with a chat template)")
        return list(texts)


def example_turns(examples: Sequence[Mapping[str, str]] | None) -> tuple[tuple[str, str], ...]:
    """`data.prompt_format.examples` as (role, content) turns; a malformed entry is named."""
    turns: list[tuple[str, str]] = []
    for i, example in enumerate(examples or ()):
        keys = set(example) if isinstance(example, Mapping) else None
        if keys != {"user", "assistant"} or not all(isinstance(example[k], str) and example[k].strip() for k in keys):
            raise UsageError(f"data.prompt_format.examples[{i}] must be {{user: <text>, assistant: <text>}}, both "
                             f"non-empty, got {example!r}")
        turns += [("user", example["user"]), ("assistant", example["assistant"])]
    return tuple(turns)


class ChatPrompt:
    def __init__(self, system_prompt: str | None = None, examples: Sequence[Mapping[str, str]] | None = None) -> None:
        self.system_prompt = system_prompt or None
        self.examples = example_turns(examples)
        self.tokenizer: PreTrainedTokenizerBase | None = None
        self._rendered: dict[tuple[Context, str], str] = {}
        self.tools: list[dict] | None = None  # JSON schemas the template lists (rollout/tools=functions)

    def with_tools(self, schemas: list[dict]) -> None:
        """Render every prompt with these tools (the template's `tools=`)."""
        self.tools, self._rendered = list(schemas), {}

    def bind(self, tokenizer: PreTrainedTokenizerBase, where: str = "") -> ChatPrompt:
        """Check the tokenizer has a template; fails before training starts."""
        if not getattr(tokenizer, "chat_template", None):
            raise UsageError(f"data/prompt_format=chat needs a tokenizer with a chat template, and the one at "
                             f"{where or 'model.name_or_path'} has none: use data/prompt_format=plain, or a chat "
                             "(instruct) model")
        self.tokenizer, self._rendered = tokenizer, {}
        return self

    def messages(self, text: str, context: Context = None) -> list[dict[str, str]]:
        context = context or ()
        lead = 0  # the data's own system message(s) stay first, ahead of the examples
        while lead < len(context) and context[lead][0] == "system":
            lead += 1
        system = (("system", self.system_prompt),) if self.system_prompt and not any(
            role == "system" for role, _ in context) else ()
        turns = (*system, *context[:lead], *self.examples, *context[lead:], ("user", text))
        return [{"role": r, "content": c} for r, c in turns]

    def conversation(self, record: Prompt) -> list[dict[str, str]]:
        """The messages the model sees for a record (before hints), for rewards that read them."""
        return self.messages(record.prompt, record.context)

    def __call__(self, texts: Sequence[str], contexts: Sequence[Context] | None = None) -> list[str]:
        if self.tokenizer is None:
            raise RuntimeError("ChatPrompt.bind(tokenizer) must run before prompts are formatted")
        if len(self._rendered) > MAX_RENDERED:  # a long run with many variants: start over
            self._rendered = {}
        keys = list(zip(contexts or [None] * len(texts), texts, strict=True))
        for key in dict.fromkeys(keys):
            if key not in self._rendered:
                self._rendered[key] = self.tokenizer.apply_chat_template(
                    self.messages(key[1], key[0]), tokenize=False, add_generation_prompt=True, tools=self.tools)
        return [self._rendered[key] for key in keys]
