"""OpenAI request bodies as pydantic models, with the ranges OpenAI documents.

Unknown fields are ignored (clients send many), but a field that would change
the answer and that mlxd cannot honour is refused with a clear 400 by
``unsupported()`` rather than silently dropped.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator

from mlxd.api.conversation import Conversation, ImagePart, Message, Part, TextPart, ToolCall, ToolTurn
from mlxd.api.plan import Plan, Requested
from mlxd.api.reasoning import ReasoningRequest, combine, effort, included, reasoning_object, template_kwargs
from mlxd.engine.logprobs import MAX_TOP
from mlxd.engine.types import PromptEnd
from mlxd.errors import BadRequest
from mlxd.registry.model import SamplingDefaults
from mlxd.tools.output_request import OutputRequest
from mlxd.tools.output_specs import ResponseFormat, ToolChoice, ToolSpec, not_an_object_schema, object_schema

# {"type": "image_url", "image_url": {"url": ...}} (chat completions) and
# {"type": "input_image", "image_url": "..."} (the Responses API's shape).
IMAGE_PART_TYPES = ("image_url", "input_image")
PART_TYPES = ("text", *IMAGE_PART_TYPES)
# A logit_bias key: a token id, as OpenAI's JSON object keys carry it
# (negative ones parse, to be refused as outside the vocabulary).
_TOKEN_ID = re.compile(r"-?[0-9]+")


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class _Common(BaseModel):
    # Python's json reads NaN and Infinity; no sampling parameter means them.
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    model: str = Field(min_length=1)
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    # 0 as OpenAI takes it: the nucleus is the most likely token alone.
    top_p: float | None = Field(default=None, ge=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0, le=1)
    repetition_penalty: float | None = Field(default=None, gt=0)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    # OpenAI's range (a signed 64-bit integer: clients send -1) and what
    # mx.random.key takes (an unsigned one); the sampler reads a negative
    # seed as its two's complement.
    seed: int | None = Field(default=None, ge=-2**63, lt=2**64)
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool | int | None = None
    # Total seconds for this request, queueing and loading included.
    timeout: float | None = Field(default=None, gt=0)
    # vLLM's extension: decode to max_tokens even past the end token.
    ignore_eos: bool = False
    # Token id (an integer, as a string) -> a bias in [-100, 100] added to
    # that token's logit at every step; ids are checked against the model's
    # vocabulary once it is leased.
    logit_bias: dict[str, Any] | None = None
    user: str | None = None

    @field_validator("logit_bias")
    @classmethod
    def _biases(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        seen: set[int] = set()
        for key, bias in (value or {}).items():
            if not _TOKEN_ID.fullmatch(key):
                raise ValueError(f"keys must be token ids (integers, as strings), not {key!r}")
            if int(key) in seen:
                raise ValueError(f"token id {int(key)} is given twice")
            seen.add(int(key))
            if isinstance(bias, bool) or not isinstance(bias, int | float) or not -100 <= bias <= 100:
                raise ValueError(f"the bias of token {key} must be a number from -100 to 100, not {bias!r}")
        return value

    def token_bias(self) -> dict[int, float] | None:
        if not self.logit_bias:
            return None
        return {int(key): float(bias) for key, bias in self.logit_bias.items()}

    @field_validator("stop")
    @classmethod
    def _encodable_stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        _check_encodable(value, "stop")
        return value

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        items = [value] if isinstance(value, str) else (value or [])
        if len(items) > 4:
            raise ValueError("at most 4 stop sequences")
        if any(s == "" for s in items):
            raise ValueError("stop sequences must not be empty")
        return value

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def unsupported(self) -> None:
        """Fields this surface cannot honour: a 400 rather than dropped."""

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def requested(self) -> Requested:
        """What this body asks of the shared request path."""
        return Requested(
            model=self.model,
            sampling=SamplingDefaults(
                max_tokens=self.requested_max_tokens(),
                temperature=self.temperature,
                top_p=self.top_p,
                top_k=self.top_k,
                min_p=self.min_p,
                repetition_penalty=self.repetition_penalty,
                presence_penalty=self.presence_penalty,
                frequency_penalty=self.frequency_penalty,
                seed=self.seed,
            ),
            stop=tuple(self.stop_list()),
            stream=self.stream,
            timeout=self.timeout,
            ignore_eos=self.ignore_eos,
            output=self.output(),
            logit_bias=self.token_bias(),
            reasoning=self.reasoning_request(),
        )

    def output(self) -> OutputRequest:
        return OutputRequest()

    def reasoning_request(self) -> ReasoningRequest:
        return ReasoningRequest()


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    arguments: str = ""


class ChatToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ChatToolCall] | None = None
    tool_call_id: str | None = None
    # An earlier answer's reasoning, as mlxd (and vLLM, DeepSeek) return it
    # or as mlx_lm.server and OpenRouter name it.
    reasoning_content: str | None = None
    reasoning: str | None = None
    # An assistant's refusal, as OpenAI returns it and its clients send it
    # back (the OpenAI Agents SDK), in place of the text it did not write.
    refusal: str | None = None

    @field_validator("content", "reasoning_content", "reasoning", "refusal")
    @classmethod
    def _encodable(cls, value: Any) -> Any:
        _check_encodable(value, "content")
        return value

    def to_message(self, index: int) -> Message:
        # What OpenAI requires too: taken as an empty prompt or an anonymous
        # result, the mistake reached the model instead of its sender.
        if self.content is None and self.role != "assistant":
            raise BadRequest(f"messages[{index}].content is required for a {self.role} message",
                             param=f"messages[{index}].content")
        if self.role == "tool" and not self.tool_call_id:
            raise BadRequest(f"messages[{index}].tool_call_id is required for a tool message (the id of the call "
                             "it answers)", param=f"messages[{index}].tool_call_id")
        # ``developer`` is what newer OpenAI models call ``system``.
        role = "system" if self.role == "developer" else self.role
        content: str | tuple[Part, ...]
        if isinstance(self.content, list):
            content = tuple(_part(p, f"messages[{index}].content[{j}]") for j, p in enumerate(self.content))
        else:
            content = self.content if self.content is not None else ""
        if role == "assistant" and self.refusal and not content:
            content = self.refusal
        calls = tuple(
            ToolCall(id=c.id, name=c.function.name, arguments=c.function.arguments,
                     param=f"messages[{index}].tool_calls[{k}].function.arguments")
            for k, c in enumerate(self.tool_calls or ())
        )
        reasoning = (self.reasoning_content or self.reasoning or "") if role == "assistant" else ""
        return Message(role=role, content=content, tool_calls=calls, tool_call_id=self.tool_call_id, name=self.name,
                       reasoning=reasoning)


def _part(part: dict[str, Any], param: str) -> Part:
    # Types were checked by ChatCompletionRequest.unsupported().
    if part.get("type") in IMAGE_PART_TYPES:
        value = part.get("image_url")
        url = value.get("url") if isinstance(value, dict) else value
        return ImagePart(url=url if isinstance(url, str) else None, param=param)
    if part.get("type") == "refusal":
        return TextPart(str(part.get("refusal", "")))
    return TextPart(str(part.get("text", "")))


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    # Parsed by ``output()`` (a BadRequest naming the field for each mistake),
    # then planned against the model's tool-call format once it is leased.
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    response_format: Any = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP)
    # Thinking models (docs/thinking.md): OpenAI's effort ("none" turns it
    # off), OpenRouter's ``reasoning`` object ({effort, max_tokens, enabled,
    # exclude}) and its older ``include_reasoning``, and the template
    # variables vLLM and mlx_lm.server take.
    reasoning_effort: str | None = None
    reasoning: dict[str, Any] | None = None
    include_reasoning: Any = None
    chat_template_kwargs: dict[str, Any] | None = None
    # vLLM's: where the prompt ends (``prompt_end``); the openai client
    # sends them through ``extra_body``.
    continue_final_message: bool = False
    add_generation_prompt: bool | None = None
    # OpenAI fields that would change the answer and that mlxd cannot honour:
    # declared so that ``unsupported`` refuses them, where as unknown fields
    # they would be dropped without a word.
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    modalities: list[str] | None = None
    web_search_options: Any = None

    def logprob_alternatives(self) -> int | None:
        """How many alternatives per token the answer lists (None: no logprobs)."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def unsupported(self) -> None:
        super().unsupported()
        for name in ("functions", "function_call"):
            if getattr(self, name) is not None:
                raise BadRequest(f"{name} (deprecated by OpenAI) is not supported; send tools and tool_choice",
                                 param=name)
        if self.audio is not None or any(m != "text" for m in self.modalities or ()):
            raise BadRequest("Only text output is supported", param="audio" if self.audio is not None else "modalities")
        if self.web_search_options is not None:
            raise BadRequest("web_search_options is not supported: mlxd's models do not search the web",
                             param="web_search_options")
        if self.logprobs is not None and not isinstance(self.logprobs, bool):
            # /v1/completions' integer form: taken as ``true``, ``logprobs: 5``
            # answered with no alternatives at all instead of the 5 it asked for.
            raise BadRequest("logprobs is true or false on /v1/chat/completions; ask for alternatives with "
                             "top_logprobs (0-20)", param="logprobs")
        if self.top_logprobs is not None and not self.logprobs:
            raise BadRequest("top_logprobs needs logprobs: true", param="top_logprobs")
        if self.logprobs and self.tools and self.tool_choice != "none":
            # The tokens would show the model's call markup.
            raise BadRequest("logprobs cannot be combined with tools", param="logprobs")
        for i, message in enumerate(self.messages):
            if isinstance(message.content, list):
                # An assistant's refusal part is what it said (OpenAI takes it there only).
                known = (*PART_TYPES, "refusal") if message.role == "assistant" else PART_TYPES
                for part in message.content:
                    if part.get("type") not in known:
                        raise BadRequest(
                            f"Unsupported content part type {part.get('type')!r}",
                            param=f"messages[{i}].content",
                        )

    def conversation(self) -> Conversation:
        messages = tuple(m.to_message(i) for i, m in enumerate(self.messages))
        _check_tool_turns(messages)
        return Conversation(messages)

    def requested(self) -> Requested:
        return replace(super().requested(), prompt_end=self.prompt_end())

    def prompt_end(self) -> PromptEnd:
        """vLLM's meaning: ``continue_final_message`` goes on from the final
        assistant message's text (a prefill); ``add_generation_prompt:
        false`` alone ends the prompt where the conversation ends. Without
        either, a final assistant message is history, answered in a new turn."""
        if not self.continue_final_message:
            return "as_is" if self.add_generation_prompt is False else "new_turn"
        if self.add_generation_prompt:
            raise BadRequest("Cannot set both `continue_final_message` and `add_generation_prompt` to true.",
                             param="continue_final_message")
        last = self.messages[-1]
        if last.role != "assistant" or last.tool_calls:
            what = "an assistant message with tool calls" if last.tool_calls else f"a {last.role} message"
            raise BadRequest(f"continue_final_message continues the text of a final assistant message that calls no "
                             f"tool; the last message here is {what}.", param="continue_final_message")
        return "continue"

    def reasoning_request(self) -> ReasoningRequest:
        return combine(
            effort(self.reasoning_effort, "reasoning_effort"),
            reasoning_object(self.reasoning, "reasoning"),
            included(self.include_reasoning),
            ReasoningRequest(template_kwargs=template_kwargs(self.chat_template_kwargs)),
        )

    def output(self) -> OutputRequest:
        return OutputRequest(
            tools=chat_tools(self.tools),
            tool_choice=chat_tool_choice(self.tool_choice),
            parallel_tool_calls=self.parallel_tool_calls,
            response_format=chat_response_format(self.response_format),
        )


def _check_tool_turns(messages: tuple[Message, ...]) -> None:
    """Tool messages answer the calls of the assistant message before them,
    each call answered, as OpenAI requires, in its words and with its
    ``param`` (``messages.[3].role``)."""
    turn = ToolTurn()
    for i, message in enumerate(messages):
        if message.role == "tool":
            if not turn.answers(message.tool_call_id):
                raise BadRequest("Invalid parameter: messages with role 'tool' must be a response to a preceeding "
                                 f"message with 'tool_calls' (messages[{i}].tool_call_id "
                                 f"`{message.tool_call_id}` answers none).", param=f"messages.[{i}].role")
            continue
        _check_answered(turn)
        turn = ToolTurn.of((message,), i)
    _check_answered(turn)


def _check_answered(turn: ToolTurn) -> None:
    if turn.unanswered():
        raise BadRequest(
            "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
            "'tool_call_id'. The following tool_call_ids did not have response messages: "
            f"{', '.join(turn.unanswered())}", param=f"messages.[{turn.at}].role")


def chat_tools(tools: Any) -> tuple[ToolSpec, ...]:
    """Chat's ``tools``: ``{"type": "function", "function": {name, description, parameters, strict}}``."""
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list.", param="tools")
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict):
            raise BadRequest(f"{where} must be {{\"type\": \"function\", \"function\": {{...}}}}.", param=where)
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise BadRequest(f"{where}.function.name must be a non-empty string.", param=where)
        # Absent is allowed (no arguments to describe); null is no schema.
        if "parameters" in function and not object_schema(function["parameters"]):
            raise BadRequest(not_an_object_schema(f"{where}.function.parameters"), param=where)
        description, strict = function.get("description"), function.get("strict")
        out.append(ToolSpec(
            name=name, param=where, description=description if isinstance(description, str) else None,
            parameters=function.get("parameters"), schema_param=f"{where}.function.parameters",
            strict=strict if isinstance(strict, bool) else None,
        ))
    return tuple(out)


def chat_tool_choice(value: Any) -> ToolChoice | None:
    """Chat's ``tool_choice``: "none", "auto", "required" or a named function."""
    if value is None:
        return None
    if value in ("none", "auto", "required"):
        return ToolChoice(value)
    function = value.get("function") if isinstance(value, dict) and value.get("type") == "function" else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise BadRequest(
            'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}.',
            param="tool_choice",
        )
    return ToolChoice("named", name)


def chat_response_format(value: Any) -> ResponseFormat | None:
    """Chat's (and completions') ``response_format``."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind in ("text", "json_object"):
        return ResponseFormat(kind)
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(spec, dict) or not isinstance(schema, dict):
            raise BadRequest(
                "response_format.json_schema.schema must be a JSON schema object.", param="response_format"
            )
        name, description, strict = spec.get("name"), spec.get("description"), spec.get("strict")
        return ResponseFormat(
            "json_schema", schema=schema, name=name if isinstance(name, str) else None,
            description=description if isinstance(description, str) else None,
            strict=strict if isinstance(strict, bool) else None,
        )
    raise BadRequest(
        "response_format.type must be one of `text`, `json_object`, `json_schema`.", param="response_format"
    )


def choices(plan: Plan, n: int) -> None:
    """``n`` choices for one prompt: copies of the plan's request, each with
    its own id and, when seeded, its own seed (else all n would be the same)."""
    if n == 1:
        return
    first = plan.requests[0]
    seed = first.sampling.seed
    plan.requests = [
        replace(
            first,
            request_id=f"{first.request_id}-{i}",
            sampling=replace(first.sampling, seed=None if seed is None else seed + i),
            stop=list(first.stop),
            choices=n,
        )
        for i in range(n)
    ]


class CompletionRequest(_Common):
    prompt: str | list[str]
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
    # Structured output: the grammar constrains the text after the prompt,
    # as it does a chat answer (no chat template needed).
    response_format: Any = None
    # Tools are rendered by a chat template and parsed in its call format;
    # a raw prompt has neither, so these are refused rather than dropped.
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _not_token_ids(cls, value: Any) -> Any:
        # OpenAI's other two forms: token ids, or a list of them. Said as
        # pydantic says it ("prompt[0]: Input should be a valid string"),
        # the refusal read as a malformed body rather than a form mlxd lacks.
        items = value if isinstance(value, list) else []
        if items and (all(isinstance(item, int) and not isinstance(item, bool) for item in items) or
                      all(isinstance(item, list) for item in items)):
            raise ValueError("token ids are not supported as a prompt; send the prompt as text (a string or a "
                             "list of strings)")
        return value

    @field_validator("prompt")
    @classmethod
    def _non_empty(cls, value: str | list[str]) -> str | list[str]:
        if isinstance(value, list) and not value:
            raise ValueError("prompt must not be an empty list")
        _check_encodable(value, "prompt")
        return value

    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    def unsupported(self) -> None:
        super().unsupported()
        for name in ("tools", "tool_choice", "parallel_tool_calls"):
            if getattr(self, name) is not None:
                raise BadRequest(
                    f"{name} is supported on /v1/chat/completions only: tools need the model's chat template",
                    param=name,
                )
        # 0 asks for the sampled token's logprob alone: an answer, not "none".
        if self.logprobs is not None and self.logprobs is not False:
            raise BadRequest("logprobs are supported on /v1/chat/completions only", param="logprobs")
        if self.n != 1:
            raise BadRequest("n > 1 is supported on /v1/chat/completions only; send the prompt n times", param="n")
        if self.echo:
            raise BadRequest("echo is not supported", param="echo")
        if self.suffix:
            raise BadRequest("suffix is not supported", param="suffix")
        if self.best_of not in (None, 1):
            raise BadRequest("best_of is not supported", param="best_of")

    def output(self) -> OutputRequest:
        return OutputRequest(response_format=chat_response_format(self.response_format))


def _check_encodable(value: Any, what: str) -> None:
    """JSON may carry a lone surrogate (``"\\ud800"``), which no tokenizer can
    encode: refuse it here as a 400 rather than fail in the engine."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{what} contains an unpaired UTF-16 surrogate; it is not valid Unicode text") from None
    elif isinstance(value, list):
        for item in value:
            _check_encodable(item, what)
    elif isinstance(value, dict):
        for item in value.values():
            _check_encodable(item, what)
