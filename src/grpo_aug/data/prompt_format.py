"""How a prompt record is presented to the model (`data/prompt_format=plain|chat`).

    plain  the record's prompt text as it is (`Q: ...\nA: `), for base models
    chat   the record's prompt text becomes the user message of the tokenizer's own chat template,
           after an optional system prompt, with the generation prompt added (instruct models)
Method hints and variants change the record's text, so they stay inside the user message. The
template is rendered once per distinct text, so a group's G rows still share one prompt and one
prefill.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

MAX_RENDERED = 100_000  # rendered prompts kept for reuse


class PlainPrompt:
    def bind(self, tokenizer: PreTrainedTokenizerBase, where: str = "") -> PlainPrompt:
        return self

    def __call__(self, texts: Sequence[str]) -> list[str]:
        return list(texts)


class ChatPrompt:
    def __init__(self, system_prompt: str | None = None) -> None:
        self.system_prompt = system_prompt or None
        self.tokenizer: PreTrainedTokenizerBase | None = None
        self._rendered: dict[str, str] = {}

    def bind(self, tokenizer: PreTrainedTokenizerBase, where: str = "") -> ChatPrompt:
        """Check the tokenizer has a template; fails before training starts."""
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"data/prompt_format=chat needs a tokenizer with a chat template, and the one at "
                             f"{where or 'model.name_or_path'} has none: use data/prompt_format=plain, or a chat "
                             "(instruct) model")
        self.tokenizer, self._rendered = tokenizer, {}
        return self

    def messages(self, text: str) -> list[dict[str, str]]:
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*system, {"role": "user", "content": text}]

    def __call__(self, texts: Sequence[str]) -> list[str]:
        if self.tokenizer is None:
            raise RuntimeError("ChatPrompt.bind(tokenizer) must run before prompts are formatted")
        if len(self._rendered) > MAX_RENDERED:  # a long run with many variants: start over
            self._rendered = {}
        for text in dict.fromkeys(texts):
            if text not in self._rendered:
                self._rendered[text] = self.tokenizer.apply_chat_template(
                    self.messages(text), tokenize=False, add_generation_prompt=True)
        return [self._rendered[text] for text in texts]
