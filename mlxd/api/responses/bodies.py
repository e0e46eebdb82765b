"""OpenAI Responses request bodies -> Requested and Conversation.

``input`` is a string or a list of items: messages (``input_text``,
``input_image``, ``output_text`` parts; ``input_file`` as its text,
``documents.py``), ``function_call`` (of a namespace's function too: ``flat_name``),
``function_call_output`` and ``reasoning`` (an earlier answer's, for the
template to render or drop). Item and tool types this adapter does not know
(built-in tools Codex also declares) are tolerated and left out.
"""

from __future__ import annotations

import json
from dataclasses import replace
from types import MappingProxyType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationInfo, field_validator

from mlxd.api.conversation import Conversation, ImagePart, Message, Part, TextPart, ToolCall
from mlxd.api.documents import input_file
from mlxd.api.error_responses import FieldNames
from mlxd.api.plan import Requested
from mlxd.api.reasoning import ReasoningRequest, combine, reasoning_object, template_kwargs
from mlxd.errors import BadRequest
from mlxd.registry.model import SamplingDefaults
from mlxd.tools.output_request import OutputRequest
from mlxd.tools.output_specs import ResponseFormat, ToolChoice, ToolSpec, not_an_object_schema, object_schema

# What this API calls the fields the shared path checks under chat's names
# (the output fields are parsed under their own: ``text.format``, ``tools[i]``).
FIELDS = FieldNames(MappingProxyType({
    "max_tokens": "max_output_tokens",
    "messages": "input",
}))
TEXT_PARTS = ("input_text", "output_text", "text", "summary_text")
# Fields asking for what mlxd does not run or keep, each refused with what
# to send instead: ignored, a conversation or prompt template would leave the
# model without the context it names.
NOT_SERVED = MappingProxyType({
    # A background response is polled at GET /v1/responses/{id} while it runs:
    # mlxd runs a response only inside its request, and stores it once answered.
    "background": "background responses are not served: mlxd answers in the request "
                  "(stream: true to follow it as it is made)",
    "conversation": "conversations are not served: mlxd keeps no Conversations API state; continue a "
                    "response with previous_response_id, or send the whole conversation in input",
    "prompt": "prompt templates are not served: mlxd keeps no stored prompts; send the prompt as "
              "instructions and input",
})
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)  # 0: greedy, as on chat
    text: dict[str, Any] | None = None
    # {"effort": ..., "summary": ...}, and OpenRouter's max_tokens / enabled
    # (docs/thinking.md); a thinking model's reasoning comes back as a
    # ``reasoning`` output item.
    reasoning: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    store: bool = True
    stream: bool = False
    previous_response_id: str | None = None
    metadata: dict[str, Any] | None = None
    # Checked as OpenAI checks them, and otherwise not used: mlxd returns no
    # log-probabilities here and never truncates a conversation.
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    truncation: Literal["auto", "disabled"] | None = None
    background: bool | None = None
    # Server-side state mlxd does not keep (NOT_SERVED); ``conversation()``
    # below is the request's own.
    conversation_ref: Any = Field(default=None, alias="conversation")
    prompt: Any = None
    # Total seconds for this request, queueing and loading included.
    timeout: float | None = Field(default=None, gt=0)

    @field_validator("background", "conversation_ref", "prompt")
    @classmethod
    def _not_served(cls, value: Any, info: ValidationInfo) -> Any:
        if value:
            raise ValueError(NOT_SERVED[info.field_name.removesuffix("_ref")])
        return value

    def function_tools(self) -> tuple[ToolSpec, ...]:
        """The function tools, those of namespaces too (built-in tool types
        are left out), each named where it is in ``tools``."""
        out: list[ToolSpec] = []
        for i, tool in enumerate(self.tools or ()):
            if tool.get("type") == "function":
                out.append(_function(tool, f"tools[{i}]"))
            elif tool.get("type") == "namespace":
                out += _namespace(tool, f"tools[{i}]")
        return tuple(out)

    def call_name(self, flat: str) -> tuple[str, str | None]:
        """A call's function name and namespace, from the name the model
        wrote (``flat_name``)."""
        for tool in self.tools or ():
            if tool.get("type") != "namespace" or not isinstance(tool.get("tools"), list):
                continue
            for function in tool["tools"]:
                if isinstance(function, dict) and flat_name(tool.get("name"), function.get("name")) == flat:
                    return str(function["name"]), str(tool["name"])
        return flat, None

    def output(self) -> OutputRequest:
        tools = self.function_tools()
        # Checked even without function tools: a misspelt choice is a 400, not ignored.
        choice = _tool_choice(self.tool_choice)
        return OutputRequest(
            tools=tools,
            tool_choice=choice if tools or (choice is not None and choice.mode not in ("auto", "none")) else None,
            parallel_tool_calls=self.parallel_tool_calls,
            response_format=_format(self.text),
        )

    def requested(self) -> Requested:
        return Requested(
            model=self.model,
            sampling=SamplingDefaults(
                max_tokens=self.max_output_tokens, temperature=self.temperature, top_p=self.top_p
            ),
            stream=self.stream,
            timeout=self.timeout,
            output=self.output(),
            reasoning=combine(
                reasoning_object(self.reasoning, "reasoning"),
                ReasoningRequest(template_kwargs=template_kwargs(self.chat_template_kwargs)),
            ),
            open_ended=True,
        )

    def history(self, earlier: tuple[Message, ...]) -> tuple[Message, ...]:
        """The conversation without instructions: what a later response continues."""
        if isinstance(self.input, str):
            return (*earlier, Message("user", self.input))
        messages = list(earlier)
        thought: list[str] = []
        for i, item in enumerate(self.input):
            if item.get("type") == "reasoning":
                thought.append(reasoning_text(item))
                continue
            _add_item(messages, item, f"input[{i}]")
            if thought and messages and messages[-1].role == "assistant":
                # A reasoning item belongs to the answer (message or call) after it.
                messages[-1] = replace(messages[-1], reasoning=thoughts(messages[-1].reasoning, *thought))
                thought = []
        _check_outputs(self.input, messages)
        return tuple(messages)

    def conversation(self, history: tuple[Message, ...]) -> Conversation:
        head = (Message("system", self.instructions),) if self.instructions else ()
        return Conversation((*head, *history))


def flat_name(namespace: Any, name: Any) -> str:
    """The one name a namespace's function has in the prompt. A function
    of a namespace (Codex sends each MCP server's tools, and its agent
    tools, as one) is called by its namespace and its name; a chat template
    knows one name a function, so the model sees the two joined:
    ``mcp__demo`` and ``lookup_order`` are ``mcp__demo__lookup_order``, the
    name Codex itself gave MCP tools before namespaces. A call splits it
    back (``ResponsesRequest.call_name``)."""
    return f"{namespace}__{name}" if namespace else str(name)


def _function(tool: dict[str, Any], where: str, namespace: str | None = None) -> ToolSpec:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest(f"{where}.name must be a non-empty string", param="tools")
    # The Responses API's parameters may be null: no arguments.
    parameters = tool.get("parameters")
    parameters = {"type": "object", "properties": {}} if parameters is None else parameters
    if not object_schema(parameters):
        raise BadRequest(not_an_object_schema(f"{where}.parameters"), param=where)
    return ToolSpec(name=flat_name(namespace, name), param=where, description=tool.get("description") or "",
                    parameters=parameters, schema_param=f"{where}.parameters")


def _namespace(tool: dict[str, Any], where: str) -> list[ToolSpec]:
    """A namespace's function tools (its custom tools, as top-level ones, are left out)."""
    name, functions = tool.get("name"), tool.get("tools")
    if not isinstance(name, str) or not name:
        raise BadRequest(f"{where}.name must be a non-empty string", param="tools")
    if not isinstance(functions, list):
        raise BadRequest(f"{where}.tools must be a list of the namespace's tools", param="tools")
    return [_function(function, f"{where}.tools[{j}]", name) for j, function in enumerate(functions)
            if isinstance(function, dict) and function.get("type") == "function"]


def _check_outputs(items: list[dict[str, Any]], messages: list[Message]) -> None:
    """Each ``function_call_output`` answers a ``function_call`` of the
    conversation, in ``input`` or in the ``previous_response_id`` chain, as
    OpenAI requires (its words and ``param``): the template rendered one that
    answers nothing as the result of no call."""
    called = {c.id for m in messages for c in m.tool_calls}
    # Calls of the types left out of the prompt count too: Codex answers an
    # OpenAI model's ``local_shell_call`` with a ``function_call_output``.
    called |= {item.get("call_id") for item in items if not str(item.get("type", "")).endswith("_output")}
    for i, item in enumerate(items):
        if item.get("type") == "function_call_output" and item["call_id"] not in called:
            raise BadRequest(f"No tool call found for function call output with call_id {item['call_id']} "
                             f"(input[{i}]).", param="input")


def reasoning_text(item: dict[str, Any]) -> str:
    """A reasoning item's text: its ``reasoning_text`` content, else its
    summary (what Codex keeps of OpenAI's encrypted reasoning)."""
    parts = item.get("content") or item.get("summary") or []
    if not isinstance(parts, list):
        return ""
    return thoughts(*(str(p.get("text", "")) for p in parts if isinstance(p, dict)))


def thoughts(*texts: str) -> str:
    """Pieces of one turn's reasoning (several items, an item's summary
    parts) as the one text a template writes: a blank line apart, as the
    Anthropic surface joins thinking blocks. Run together, "...the file is
    YAML." and "Two keys..." read as one sentence to the model."""
    return "\n\n".join(t for t in texts if t)


def _tool_choice(value: str | dict[str, Any] | None) -> ToolChoice | None:
    if value is None:
        return None
    if value in ("auto", "none", "required"):
        return ToolChoice(value)  # type: ignore[arg-type]
    if isinstance(value, dict) and value.get("type") == "function" and isinstance(value.get("name"), str):
        return ToolChoice("named", flat_name(value.get("namespace"), value["name"]))
    raise BadRequest(
        'tool_choice must be "auto", "none", "required" or {"type": "function", "name": ...}', param="tool_choice"
    )


def _format(text: dict[str, Any] | None) -> ResponseFormat | None:
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise BadRequest(
            'text.format must be an object: {"type": "text"}, {"type": "json_object"} or '
            '{"type": "json_schema", "name": ..., "schema": {...}}',
            param="text.format",
        )
    if fmt.get("type") in (None, "text"):
        return None
    if fmt.get("type") == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise BadRequest("text.format.schema must be a JSON schema object", param="text.format")
        name, strict = fmt.get("name"), fmt.get("strict")
        return ResponseFormat("json_schema", param="text.format", schema=fmt["schema"],
                              name=name if isinstance(name, str) else None,
                              strict=strict if isinstance(strict, bool) else None)
    if fmt.get("type") == "json_object":
        return ResponseFormat("json_object", param="text.format")
    raise BadRequest("text.format.type must be one of `text`, `json_schema`, `json_object`", param="text.format")


def _content(content: Any, param: str) -> str | tuple[Part, ...]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{param}.content must be a string or a list of parts", param=param)
    parts: list[Part] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS:
            parts.append(TextPart(str(part.get("text", ""))))
        elif kind == "input_image":
            url = part.get("image_url")
            where = f"{param}.content[{j}]"
            if not isinstance(url, str) or not url.strip():
                raise BadRequest(f"{where}.image_url must be the image's URL (a data: URL or a link).", param=where)
            parts.append(ImagePart(url=url, param=where))
        elif kind == "input_file":
            parts.append(TextPart(input_file(part)))
        elif kind == "refusal":
            # An assistant's refusal, as OpenAI returns it: what that turn said.
            parts.append(TextPart(str(part.get("refusal", ""))))
        # Part types newer than this adapter: left out.
    return tuple(parts)


def _add_item(messages: list[Message], item: dict[str, Any], param: str) -> None:
    kind = item.get("type", "message")
    if kind == "message":
        role = ROLES.get(str(item.get("role")))
        if role is None:
            raise BadRequest(f"{param}.role must be user, assistant, system or developer", param=param)
        messages.append(Message(role, _content(item.get("content", ""), param)))  # type: ignore[arg-type]
    elif kind == "function_call":
        arguments = item.get("arguments", "")
        call = ToolCall(
            id=str(item.get("call_id") or item.get("id") or ""),
            name=flat_name(item.get("namespace"), item.get("name", "")),
            arguments=arguments if isinstance(arguments, str) else json.dumps(arguments),
            param=f"{param}.arguments",
        )
        last = messages[-1] if messages else None
        # Calls made in one turn belong to that turn's assistant message, with
        # the reasoning that came before them (Codex sends it ahead of the first).
        if last is not None and last.role == "assistant":
            messages[-1] = replace(last, tool_calls=(*last.tool_calls, call))
        else:
            messages.append(Message("assistant", "", tool_calls=(call,)))
    elif kind == "function_call_output":
        if not isinstance(item.get("call_id"), str) or not item["call_id"]:
            # The id of the call it answers: without it, anyone's.
            raise BadRequest(f"Missing required parameter: '{param}.call_id'.", param=f"{param}.call_id")
        output = item.get("output", "")
        if isinstance(output, list):
            output = "".join(str(p.get("text", "")) for p in output if isinstance(p, dict))
        messages.append(Message("tool", str(output), tool_call_id=item["call_id"]))
    # reasoning, web_search_call, local_shell_call, ...: left out.
