"""How a completion calls a tool, and how the tool's answer joins the transcript.

    TextTools  plain-text models: a call marker, the argument, an end marker (the end marker stops
               the policy's segment), and the tool's output spliced after it through `result`.
               `rollout/tools=calculator` writes `[47+8]` and gets `=55`; `rollout/tools=gsm8k_calculator`
               is GSM8K's own `<<47+8=` -> `55>>` for data that carries those annotations.
    ChatTools  chat models: Python functions given by import path (`rollout.tools.functions`), their
               JSON schemas read from type hints and docstrings (transformers' get_json_schema, what
               chat templates take as `tools=`), a call in the Hermes form the common templates use
               (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`), the result rendered by the
               model's own chat template as a `tool` message.
The argument is the model's text: a tool must treat it as hostile (the calculator is mathtext's
bounded evaluator, never eval); calls run under tools/runner.py's limits.
"""

from __future__ import annotations

import functools
import importlib
import json
from collections.abc import Callable, Sequence

from grpo_aug.errors import UsageError
from grpo_aug.tools.runner import ToolError, ToolLimits, ToolRunner

MAX_CALL_CHARS = 2000  # a call's text beyond this is not parsed
PLACEHOLDER = "\x00CALL\x00"  # an assistant turn's content, to find where the template closes the turn


def import_function(path: str, where: str) -> Callable:
    """`package.module.function` -> the function; a clear error naming `where` otherwise."""
    module, _, name = str(path).rpartition(".")
    try:
        fn = getattr(importlib.import_module(module), name) if module else None
    except (ImportError, AttributeError) as err:
        raise UsageError(f"{where}: cannot import {path!r} ({err})") from err
    if not callable(fn):
        raise UsageError(f"{where}: {path!r} is not an importable function (package.module.function)")
    return fn


class NoTools:
    active = False


class Calls:
    """A call protocol's side of one generate call: no state, nothing before the first turn, and a
    row goes on after every answer."""

    def __init__(self, protocol, n: int) -> None:
        self.protocol, self.n = protocol, n

    def opening(self) -> list[None]:
        return [None] * self.n

    def requests(self, rows: Sequence[int], segments: Sequence[str]) -> list[Callable[[], object] | None]:
        return self.protocol.requests(segments)

    role = "tool"

    def answer(self, row: int, outcome) -> tuple[str, bool]:
        return self.protocol.render(outcome.text), False

    def rewards(self) -> None:
        return None


class TextTools:
    """One tool, one string argument, called through markers in plain text."""

    active = True

    def __init__(self, function: str = "grpo_aug.tools.calculator.calculator", call: str = "[", end: str = "]",
                 result: str = "={output}", max_transcript_tokens: int = 128,
                 limits: ToolLimits | None = None, name: str = "calculator", warmup_share: float = 0.3) -> None:
        if not call or not end:
            raise UsageError(f"rollout.tools.call and rollout.tools.end must be non-empty, got {call!r}, {end!r}")
        if "{output}" not in result:
            raise UsageError(f"rollout.tools.result must contain {{output}}, got {result!r}")
        if max_transcript_tokens < 1:
            raise UsageError(f"rollout.tools.max_transcript_tokens must be >= 1, got {max_transcript_tokens}")
        if not 0.0 <= warmup_share <= 1.0:
            raise UsageError(f"rollout.tools.warmup_share must be in [0, 1], got {warmup_share}")
        self.warmup_share = warmup_share
        self.fn = import_function(function, "rollout.tools.function")
        self.function, self.name = function, name
        self.call, self.end, self.result = call, end, result
        self.max_transcript_tokens = max_transcript_tokens
        self.runner = ToolRunner(limits or ToolLimits())

    @property
    def stop(self) -> tuple[str, ...]:
        return (self.end,)

    def bind(self, tokenizer, prompt_format) -> TextTools:
        return self

    def session(self, records, n: int) -> Calls:
        return Calls(self, n)

    def describe(self) -> str:
        return f"{self.name} ({self.function}): {self.call}argument{self.end} -> {self.result}"

    def argument(self, segment: str) -> str | None:
        """The argument of the call that ends this segment of policy text (between the last call
        marker and the end marker that stopped it); None when the end marker has no call before it."""
        stop = segment.rfind(self.end)
        start = segment.rfind(self.call, 0, max(stop, 0))
        if stop < 0 or start < 0:
            return None
        return segment[start + len(self.call) : stop][:MAX_CALL_CHARS]

    def requests(self, segments: Sequence[str]) -> list[Callable[[], object] | None]:
        """Per segment, the call to run (None: the end marker closed no call: the row just goes on)."""
        return [None if (arg := self.argument(s)) is None else functools.partial(self.fn, arg) for s in segments]

    def render(self, outcome_text: str) -> str:
        return self.result.format(output=outcome_text)


class ChatTools:
    """Python functions as tools of a chat model (TRL's `tools=[fn]`)."""

    active = True
    open_tag, close_tag = "<tool_call>", "</tool_call>"

    def __init__(self, functions: Sequence[str], max_transcript_tokens: int = 512,
                 limits: ToolLimits | None = None) -> None:
        if not functions:
            raise UsageError("rollout.tools.functions must name at least one function (package.module.function)")
        if max_transcript_tokens < 1:
            raise UsageError(f"rollout.tools.max_transcript_tokens must be >= 1, got {max_transcript_tokens}")
        from transformers.utils import get_json_schema

        self.functions = {}
        self.schemas = []
        for path in functions:
            fn = import_function(path, "rollout.tools.functions")
            try:
                schema = get_json_schema(fn)
            except Exception as err:  # transformers names the missing type hint or docstring entry
                raise UsageError(f"rollout.tools.functions: {path!r} has no usable schema: {err}") from err
            self.functions[schema["function"]["name"]] = fn
            self.schemas.append(schema)
        self.max_transcript_tokens = max_transcript_tokens
        self.runner = ToolRunner(limits or ToolLimits())
        self.tokenizer = self.closed = None

    @property
    def stop(self) -> tuple[str, ...]:
        return (self.close_tag,)

    def bind(self, tokenizer, prompt_format) -> ChatTools:
        if not hasattr(prompt_format, "with_tools"):
            raise UsageError("rollout/tools=functions calls tools through the chat template: use "
                             "data/prompt_format=chat (a model with a chat template)")
        prompt_format.with_tools(self.schemas)
        self.tokenizer, self.closed = tokenizer, None
        return self

    def session(self, records, n: int) -> Calls:
        return Calls(self, n)

    def describe(self) -> str:
        return "functions " + ", ".join(self.functions) + f" ({self.open_tag}{{json}}{self.close_tag})"

    def parse(self, segment: str) -> tuple[Callable, dict] | str | None:
        """(function, arguments), an error message, or None (no call)."""
        stop = segment.rfind(self.close_tag)
        start = segment.rfind(self.open_tag, 0, max(stop, 0))
        if stop < 0 or start < 0:
            return None
        body = segment[start + len(self.open_tag) : stop].strip()
        if len(body) > MAX_CALL_CHARS:
            return f"error: the call is longer than {MAX_CALL_CHARS} characters"
        try:
            call = json.loads(body)
        except ValueError as err:
            return f"error: the call is not JSON ({err})"
        if not isinstance(call, dict) or not isinstance(call.get("arguments", {}), dict):
            return 'error: a call is {"name": ..., "arguments": {...}}'
        fn = self.functions.get(call.get("name"))
        if fn is None:
            return f"error: no tool named {str(call.get('name'))[:50]!r}; tools: {', '.join(self.functions)}"
        return fn, call.get("arguments", {})

    def requests(self, segments: Sequence[str]) -> list[Callable[[], object] | None]:
        out = []
        for s in segments:
            parsed = self.parse(s)
            if parsed is None or isinstance(parsed, str):
                out.append(None if parsed is None else _fail(parsed))
            else:
                fn, arguments = parsed
                out.append(functools.partial(fn, **arguments))
        return out

    def render(self, outcome_text: str) -> str:
        """The tokens after the policy's call: the end of its turn, the `tool` message and the next
        assistant header, as the model's chat template writes them. Found by rendering the turn
        with a placeholder content: what follows the placeholder closes the assistant's turn."""
        messages = [{"role": "user", "content": "."}, {"role": "assistant", "content": PLACEHOLDER}]
        if self.closed is None:  # the same for every call: rendered once
            self.closed = self.tokenizer.apply_chat_template(messages, tools=self.schemas, tokenize=False)
        closed, placeholder = self.closed, PLACEHOLDER
        full = self.tokenizer.apply_chat_template(messages + [{"role": "tool", "content": outcome_text}],
                                                  tools=self.schemas, tokenize=False, add_generation_prompt=True)
        if not full.startswith(closed) or placeholder not in closed:
            raise UsageError("the chat template does not render a tool message after an assistant turn as a "
                             "continuation of it: rollout/tools=functions cannot splice tool results for this model")
        return closed[closed.index(placeholder) + len(placeholder) :] + full[len(closed) :]


def _fail(message: str) -> Callable[[], object]:
    def call():
        raise ToolError(message)
    return call
