"""Anthropic Messages request bodies -> Requested and Conversation.

Tolerant the way Claude Code needs a server to be: unknown top-level fields
and unknown content block types are ignored (newer clients send fields older
servers answered 422 to), an assistant's ``thinking`` blocks become its
message's reasoning (for the template to render or drop), ``redacted_thinking``
blocks are dropped, ``document`` and ``search_result`` blocks are read as
text (``documents.py``), and a ``system`` role inside ``messages`` becomes a
system message. Tool search: a tool with ``defer_loading`` stays out of the
prompt's tool list, and a ``tool_reference`` in a tool result is written out
there as the tool's definition (``_found_tools``). ``thinking`` and
``output_config.effort`` say what a thinking model does (docs/thinking.md). A final ``assistant`` message with
text and no tool call is a prefill: the answer continues it (api/prefill.py).
Tools and tool_choice are parsed into the shared typed ``OutputRequest``,
each named as this API spells it (``tools[0].input_schema``).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from mlxd.api.anthropic import normalise
from mlxd.api.anthropic.signatures import reasoning_of
from mlxd.api.conversation import Conversation, ImagePart, Message, Part, TextPart, ToolCall, ToolTurn
from mlxd.api.documents import DOCUMENTS, anthropic_document
from mlxd.api.plan import Requested
from mlxd.api.reasoning import ReasoningRequest, combine, effort, template_kwargs
from mlxd.engine.types import PromptEnd
from mlxd.errors import BadRequest
from mlxd.registry.model import SamplingDefaults
from mlxd.tools.output_request import OutputRequest
from mlxd.tools.output_specs import ResponseFormat, ToolChoice, ToolSpec, not_an_object_schema, object_schema


class AnthropicMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class Tool(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1)
    description: str | None = None
    # Server tools (web search, code execution, ...) carry a ``type`` and no
    # schema: mlxd runs none of them, so they are left out of the prompt.
    input_schema: dict[str, Any] | None = None
    type: str | None = None
    # Tool search (docs/agents.md): left out of the prompt's tool list until
    # a ``tool_reference`` in a tool result names it.
    defer_loading: bool = False


class _Base(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    messages: list[AnthropicMessage] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: dict[str, Any] | None = None
    # {"type": "enabled", "budget_tokens": N}, {"type": "adaptive"} or {"type": "disabled"};
    # the first two may say "display": "summarized" | "omitted".
    thinking: dict[str, Any] | None = None
    # {"effort": "low" | "medium" | "high" | "max", "format": {"type": "json_schema", "schema": {...}}}.
    output_config: dict[str, Any] | None = None
    # The structured-outputs beta's name for output_config.format.
    output_format: Any = None
    # vLLM's and mlx_lm.server's template variables, here too.
    chat_template_kwargs: dict[str, Any] | None = None

    def reasoning(self) -> ReasoningRequest:
        config = self.output_config or {}
        return combine(
            _thinking(self.thinking),
            effort(config.get("effort") if isinstance(config, dict) else None, "output_config.effort"),
            ReasoningRequest(template_kwargs=template_kwargs(self.chat_template_kwargs)),
        )

    def prompt_end(self) -> PromptEnd:
        """Where the prompt ends: inside a final assistant message that has
        text and calls no tool (Anthropic's prefill), else at a new turn."""
        last = self.messages[-1]
        if last.role != "assistant":
            return "new_turn"
        blocks = [{"type": "text", "text": last.content}] if isinstance(last.content, str) else last.content
        text = "".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
        if not text.strip() or any(b.get("type") == "tool_use" for b in blocks):
            return "new_turn"
        if text[-1].isspace():
            # Anthropic refuses it: a prompt cut after a space or newline
            # leaves the model a token boundary no tokenizer would write,
            # and its answers there go wrong. The same refusal keeps a
            # client built here working there.
            raise BadRequest("messages: final assistant content cannot end with trailing whitespace",
                             param=f"messages[{len(self.messages) - 1}].content")
        return "continue"

    def conversation(self) -> Conversation:
        messages: list[Message] = []
        system = _system_text(self.system)
        if system:
            messages.append(Message("system", system))
        called = ToolTurn()  # the tool_use blocks of the assistant turn before
        tools = {t.name: t for t in self.tools or ()}
        for i, message in enumerate(self.messages):
            turn = _messages(message, f"messages[{i}]", tools)
            _check_results(message, called, i)
            _check_all_answered(called)
            called = ToolTurn.of(turn, i) if message.role == "assistant" else ToolTurn()
            messages += turn
        return Conversation(tuple(messages))

    def output(self) -> OutputRequest:
        # Server tools (a ``type`` of their own, no schema) are left out.
        found = self._found()
        # Anthropic's own tool search (a server tool, which mlxd does not run)
        # is the model's only way to its deferred tools: with it they are
        # listed, as before mlxd deferred any, or the model would never see one.
        hosted_search = any((t.type or "").startswith("tool_search_tool") for t in self.tools or ())
        tools = tuple(
            _tool(t, f"tools[{i}]", found, hosted_search) for i, t in enumerate(self.tools or ())
            if t.type in (None, "custom") or t.input_schema is not None
        )
        if tools and not any(t.listed for t in tools):
            # Anthropic's rule too: with every tool deferred, the prompt
            # would show none, nor how to call one.
            raise BadRequest("tools: every tool has `defer_loading: true`; at least one tool must not be deferred.",
                             param="tools")
        choice, parallel = _tool_choice(self.tool_choice)
        form = self._format()
        if not tools:
            if choice is not None and choice.mode == "required":
                raise BadRequest("tool_choice `any` needs `tools`.", param="tool_choice")
            if choice is not None and choice.mode == "named":
                # Refused by the shared check: the tool it names is not there.
                return OutputRequest(tool_choice=choice, response_format=form)
            # tool_choice "none" or nothing to call: the answer is text.
            return OutputRequest(response_format=form)
        return OutputRequest(tools=tools, tool_choice=choice, parallel_tool_calls=parallel, response_format=form)

    def _found(self) -> set[str]:
        """The tools a ``tool_reference`` in a tool result names: those a
        tool search showed the model."""
        return {str(ref.get("tool_name")) for message in self.messages if isinstance(message.content, list)
                for block in message.content if block.get("type") == "tool_result"
                for ref in _references(block.get("content"))}

    def _format(self) -> ResponseFormat | None:
        """Structured output: ``output_config.format`` (or the beta's
        top-level ``output_format``), ``{"type": "json_schema", "schema"}``.
        Anthropic's are always strict (no key the schema does not declare)."""
        config = self.output_config if isinstance(self.output_config, dict) else {}
        where, value = ("output_config.format", config["format"]) if config.get("format") is not None else \
            ("output_format", self.output_format)
        if value is None:
            return None
        if not isinstance(value, dict) or value.get("type") != "json_schema" or not isinstance(
                value.get("schema"), dict):
            raise BadRequest(f'{where} must be {{"type": "json_schema", "schema": {{...}}}}', param=where)
        return ResponseFormat("json_schema", param=where, schema=value["schema"], strict=True)


def _tool(tool: Tool, where: str, found: set[str], hosted_search: bool = False) -> ToolSpec:
    # A custom tool's input_schema is required, and an object's.
    if not object_schema(tool.input_schema):
        raise BadRequest(not_an_object_schema(f"{where}.input_schema"), param=where)
    deferred = tool.defer_loading and not hosted_search
    return ToolSpec(name=tool.name, param=where, description=tool.description or "", parameters=tool.input_schema,
                    schema_param=f"{where}.input_schema", listed=not deferred, known=not deferred or tool.name in found)


class MessagesRequest(_Base):
    max_tokens: StrictInt = Field(ge=1)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    stream: bool = False

    def requested(self) -> Requested:
        stops = tuple(s for s in self.stop_sequences or () if s)
        # (Anthropic refuses a budget not below max_tokens; tolerated here, as
        # the rest of a body is: max_tokens then ends the reasoning first.)
        reasoning = self.reasoning()
        return Requested(
            model=self.model,
            sampling=SamplingDefaults(
                max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k
            ),
            stop=stops,
            stream=self.stream,
            output=self.output(),
            reasoning=reasoning,
            max_tokens_is_cap=True,
            prompt_end=self.prompt_end(),
        )


class CountTokensRequest(_Base):
    """The same body without ``max_tokens`` (and nothing generated)."""


def _thinking(value: dict[str, Any] | None) -> ReasoningRequest:
    if value is None:
        return ReasoningRequest()
    kind = value.get("type")
    if kind == "disabled":
        return ReasoningRequest(enabled=False)
    if kind not in ("enabled", "adaptive"):
        raise BadRequest("thinking.type must be one of `enabled`, `adaptive`, `disabled`.", param="thinking.type")
    omitted = _display(value.get("display"))
    budget = value.get("budget_tokens") if kind == "enabled" else None
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise BadRequest("thinking.budget_tokens must be a whole number of tokens, at least 1.",
                         param="thinking.budget_tokens")
    return ReasoningRequest(enabled=True, budget=budget, omitted=omitted)


def _display(value: Any) -> bool:
    """Anthropic's ``thinking.display``: ``omitted`` keeps the thinking
    blocks with their text empty (Claude Code sends it); ``summarized`` (and
    no field) shows the reasoning."""
    if value is None or value == "summarized":
        return False
    if value == "omitted":
        return True
    raise BadRequest("thinking.display must be `summarized` or `omitted`.", param="thinking.display")


def _system_text(system: str | list[dict[str, Any]] | None) -> str:
    if system is None:
        return ""
    if isinstance(system, str):
        return normalise.without_billing_header(system)
    texts = [normalise.without_billing_header(str(b.get("text", ""))) for b in system if b.get("type") == "text"]
    return "\n\n".join(t for t in texts if t)


def _tool_choice(value: dict[str, Any] | None) -> tuple[ToolChoice | None, bool | None]:
    """Anthropic's tool_choice, and whether calls may come in parallel."""
    if value is None:
        return ToolChoice("auto"), None
    kind = value.get("type")
    parallel = None if "disable_parallel_tool_use" not in value else not value["disable_parallel_tool_use"]
    if kind in ("auto", "none"):
        return ToolChoice(kind), parallel
    if kind == "any":
        return ToolChoice("required"), parallel
    if kind == "tool":
        name = value.get("name")
        if not isinstance(name, str) or not name:
            raise BadRequest("tool_choice.name: a tool name is required for type `tool`", param="tool_choice")
        return ToolChoice("named", name), parallel
    raise BadRequest(
        "tool_choice.type must be one of `auto`, `any`, `tool`, `none`", param="tool_choice"
    )


def _image(block: dict[str, Any], param: str) -> ImagePart:
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    value = source.get("data" if kind == "base64" else "url") if isinstance(source, dict) else None
    if kind not in ("base64", "url") or not isinstance(value, str) or not value.strip():
        raise BadRequest(
            f"{param}.source: an image block needs a source of type `base64` (with `media_type` and `data`) "
            "or `url` (with `url`).",
            param=f"{param}.source",
        )
    if kind == "base64":
        return ImagePart(url=f"data:{source.get('media_type') or 'image/png'};base64,{value}", param=param)
    return ImagePart(url=value, param=param)


def _result_text(content: Any, tools: dict[str, Tool], where: str) -> str:
    """A tool result's content: its text, any document or search result in
    it as text, and the definitions of the tools its ``tool_reference``
    blocks name (what a tool search found: ``_found_tools``)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    texts = [str(b.get("text", "")) if b.get("type") == "text" else anthropic_document(b)
             for b in content if isinstance(b, dict) and b.get("type") in ("text", *DOCUMENTS)]
    found = _found_tools(content, tools, where)
    return "\n".join([found, *texts] if found else texts)


def _references(content: Any) -> list[dict[str, Any]]:
    return [b for b in content if isinstance(b, dict) and b.get("type") == "tool_reference"] \
        if isinstance(content, list) else []


def _found_tools(content: list[Any], tools: dict[str, Tool], where: str) -> str:
    """The tools a tool search found, written where it found them, in the
    form Claude Code's ToolSearch tells the model to expect (a ``<function>``
    line of JSON each, in a ``<functions>`` block). Anthropic expands a
    ``tool_reference`` into the tool's definition; here the definition goes
    into the conversation, not into the prompt's tool list, so the prompt
    before this turn stays as it was and the prefix cache keeps it."""
    lines = []
    for j, ref in enumerate(_references(content)):
        name = ref.get("tool_name")
        tool = tools.get(name) if isinstance(name, str) else None
        if tool is None:
            raise BadRequest(f"{where}.content[{j}]: `tool_reference` names `{name}`, which is not in `tools`.",
                             param=f"{where}.content[{j}].tool_name")
        function = {"description": tool.description or "", "name": tool.name, "parameters": tool.input_schema or {}}
        lines.append(f"<function>{json.dumps(function, ensure_ascii=False)}</function>")
    return "<functions>\n" + "\n".join(lines) + "\n</functions>" if lines else ""


def _check_results(message: AnthropicMessage, called: ToolTurn, at: int) -> None:
    """A tool result answers a tool_use of the assistant turn before, as
    Anthropic requires (its words, which clients such as Claude Code look
    for): one that answers nothing reached the template as a result of no
    call (a client that lost its history, or sent the wrong id)."""
    for j, block in enumerate(message.content if isinstance(message.content, list) else ()):
        call_id = str(block.get("tool_use_id", ""))
        if block.get("type") == "tool_result" and not called.answers(call_id):
            raise BadRequest(
                f"messages.{at}.content.{j}: unexpected `tool_use_id` found in `tool_result` blocks: {call_id}. "
                "Each `tool_result` block must have a corresponding `tool_use` block in the previous message.",
                param=f"messages[{at}].content[{j}].tool_use_id")


def _check_all_answered(called: ToolTurn) -> None:
    """The message after an assistant turn with tool_use blocks answers each
    of them, as Anthropic requires (its words): a call left unanswered
    reached the template as a call the model then waits on. A conversation
    that ends with the calls is not checked here (its answer comes next)."""
    if called.unanswered():
        raise BadRequest(
            f"messages.{called.at}: `tool_use` ids were found without `tool_result` blocks immediately after: "
            f"{', '.join(called.unanswered())}. Each `tool_use` block must have a corresponding `tool_result` "
            "block in the next message.", param=f"messages[{called.at}].content")


def _messages(message: AnthropicMessage, param: str, tools: dict[str, Tool]) -> list[Message]:
    """One Anthropic message as internal messages: tool results become tool
    messages (before the rest of the turn, as the template expects), tool_use
    blocks the assistant's tool calls."""
    if isinstance(message.content, str):
        text = message.content
        if message.role == "system":
            text = normalise.without_billing_header(text)
        return [Message(message.role, text)]
    parts: list[Part] = []
    calls: list[ToolCall] = []
    results: list[Message] = []
    reasoning: list[str] = []
    for j, block in enumerate(message.content):
        where = f"{param}.content[{j}]"
        kind = block.get("type")  # (each block is an object: the body's model says so)
        if not isinstance(kind, str):
            raise BadRequest(f"{where}: a content block is an object with a `type`.", param=where)
        if kind == "thinking" and message.role == "assistant":
            # Sent back with its text omitted, its reasoning is in its signature.
            reasoning.append(str(block.get("thinking", "")) or reasoning_of(block.get("signature")))
        elif kind == "text":
            parts.append(TextPart(str(block.get("text", ""))))
        elif kind == "image":
            parts.append(_image(block, where))
        elif kind in DOCUMENTS:
            parts.append(TextPart(anthropic_document(block)))
        elif kind == "tool_use":
            arguments = block.get("input", {})
            if not isinstance(arguments, dict):
                raise BadRequest(
                    f"{where}.input: a tool_use block's input must be a JSON object.", param=f"{where}.input"
                )
            calls.append(
                ToolCall(
                    id=str(block.get("id", "")),
                    name=str(block.get("name", "")),
                    arguments=json.dumps(arguments, ensure_ascii=False),
                    param=f"{where}.input",
                )
            )
        elif kind == "tool_result":
            text = _result_text(block.get("content"), tools, where)
            if block.get("is_error"):
                text = f"Error: {text}"
            results.append(Message("tool", text, tool_call_id=str(block.get("tool_use_id", ""))))
        # redacted_thinking, server tool blocks, and block types newer than
        # this adapter: tolerated and left out.
    out = list(results)
    if message.role == "system":
        text = normalise.without_billing_header("".join(p.text for p in parts if isinstance(p, TextPart)))
        return [*out, Message("system", text)] if text else out
    if parts or calls or not results:
        # Each thinking block is a passage of its own (mlxd streams one per
        # stretch of reasoning): run together, the last sentence of one and
        # the first of the next became one line in the template.
        out.append(Message(message.role, tuple(parts) if parts else "", tool_calls=tuple(calls),
                           reasoning="\n\n".join(reasoning)))
    return out
