"""The grammar that forces a tool call: ``tool_choice: required`` or a named function.

The call is written in the model family's own wrapper (what its chat template
shows it) with the arguments checked against the tool's ``parameters``
schema by llguidance's ``%json``, so even a random-weight model produces a
call that parses and validates. Whitespace inside the JSON is fixed (the
separators the templates use), so a weak model cannot pad it forever.

Families: ``json_tools`` (Hermes / Qwen 2.5 / Qwen 3), ``qwen3_coder``
(XML parameters), ``mistral`` (``[TOOL_CALLS]``, with or without ``[ARGS]``),
``llama3_json``, ``glm47`` (GLM-4.5+: ``<arg_key>``/``<arg_value>`` pairs),
``pythonic`` (LFM2: ``[name(key=value)]``), ``gemma4`` (``call:name{key:value}``
with ``<|"|>`` strings) and ``harmony`` (gpt-oss: a commentary message to
``functions.NAME``, after an analysis message if the model writes one). Others get a BadRequest naming the format.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from mlxd.engine.types import Constraint
from mlxd.errors import BadRequest
from mlxd.tools.formats import HARMONY, HARMONY_ANALYSIS, LLAMA3_JSON, ToolFormat
from mlxd.tools.output_specs import ToolSpec

# The separators chat templates render tool-call JSON with (Python's json.dumps).
_JSON_STYLE = {"whitespace_flexible": False, "key_separator": ": ", "item_separator": ", "}
FORCEABLE = ("json_tools", "qwen3_coder", "mistral", LLAMA3_JSON, "glm47", "pythonic", "gemma4", HARMONY)


def forced_call(
    fmt: ToolFormat,
    tools: Sequence[ToolSpec],
    name: str | None = None,
    *,
    max_calls: int = 1,
) -> Constraint:
    """A constraint whose every sentence is ``1..max_calls`` calls of ``tools``
    (only of the tool ``name`` when given)."""
    functions = _functions(tools)
    if name is not None:
        functions = [f for f in functions if f["name"] == name]
        if not functions:
            raise BadRequest(f"tool_choice names `{name}`, which is not in `tools`.", param="tool_choice")
    if not functions:
        raise BadRequest("tool_choice requires at least one function in `tools`.", param="tools")
    if fmt.name not in FORCEABLE:
        raise BadRequest(
            f"tool_choice `required` or a named function cannot be enforced for this model's "
            f"tool format (`{fmt.name}`); enforced formats: {', '.join(FORCEABLE)}.",
            param="tool_choice",
        )
    builder = {
        "json_tools": _hermes,
        "qwen3_coder": _qwen3_coder,
        "mistral": _mistral,
        LLAMA3_JSON: _llama3,
        "glm47": _glm47,
        "pythonic": _pythonic,
        "gemma4": _gemma4,
        HARMONY: _harmony,
    }
    if fmt.name == HARMONY:
        # One message per call: its <|call|> ends the generation.
        max_calls = 1
    call = builder[fmt.name](fmt, functions)
    repeat = "" if max_calls <= 1 else f"(SEP call){{0,{max_calls - 1}}}"
    sep = '\nSEP: "\\n"' if max_calls > 1 else ""
    return Constraint.lark(f"start: call{repeat}\n{call}{sep}\n")


def _functions(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    # A tool without a schema takes any object of arguments.
    empty = {"type": "object", "properties": {}}
    return [{"name": t.name, "parameters": closed(t.parameters if t.parameters is not None else empty)} for t in tools]


def closed(schema: Any) -> Any:
    """``schema`` with ``additionalProperties: false`` wherever it has
    ``properties`` and says nothing: a tool cannot use keys it did not
    declare, and a weak model would otherwise invent keys until max_tokens."""
    if isinstance(schema, list):
        return [closed(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed(v) if k in _SUBSCHEMA_KEYS else v for k, v in schema.items()}
    for key in ("properties", *_NAMED_SUBSCHEMAS):
        if isinstance(out.get(key), dict):
            out[key] = {k: closed(v) for k, v in out[key].items()}
    if "properties" in out and isinstance(out["properties"], dict):
        out.setdefault("additionalProperties", False)
    return out


_SUBSCHEMA_KEYS = ("items", "anyOf", "oneOf", "allOf", "prefixItems")
# Maps of name -> schema: each schema is closed (Pydantic's nested models
# live in ``$defs``).
_NAMED_SUBSCHEMAS = ("$defs", "definitions")


def _json(schema: dict[str, Any]) -> str:
    # x-guidance sets llguidance's JSON options for this %json only.
    return "%json " + json.dumps({**schema, "x-guidance": _JSON_STYLE})


def _quote(text: str) -> str:
    return json.dumps(text)


def _has_refs(schema: Any) -> bool:
    if isinstance(schema, dict):
        return isinstance(schema.get("$ref"), str) or any(_has_refs(v) for v in schema.values())
    return isinstance(schema, list) and any(_has_refs(v) for v in schema)


def _rebased(schema: Any, base: str) -> Any:
    """``schema`` with each local ``$ref`` (``#``, ``#/$defs/X``, ...) made to
    point under ``base``, the JSON pointer where ``schema`` now sits."""
    if isinstance(schema, list):
        return [_rebased(s, base) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _rebased(v, base) for k, v in schema.items()}
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#"):
        out["$ref"] = base + ref[1:]
    return out


def _placed(function: dict[str, Any], slot: str, defs: dict[str, Any]) -> Any:
    """The function's parameters to nest inside a larger schema. Their
    ``$ref`` pointers (Pydantic's ``#/$defs/Model``) are written against
    their own root, which nesting moves: a schema with any goes whole into
    the larger one's ``defs`` under ``slot``, its pointers rebased there,
    and is referred to; one without stays inline as it was."""
    params = function["parameters"]
    if not _has_refs(params):
        return params
    defs[slot] = _rebased(params, f"#/$defs/{slot}")
    return {"$ref": f"#/$defs/{slot}"}


def _call_object(function: dict[str, Any], arguments_key: str, arguments: Any) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": function["name"]}, arguments_key: arguments},
        "required": ["name", arguments_key],
        "additionalProperties": False,
    }


def _any_call(functions: list[dict[str, Any]], arguments_key: str) -> dict[str, Any]:
    defs: dict[str, Any] = {}
    objects = [_call_object(f, arguments_key, _placed(f, f"mlxd_tool_{i}", defs)) for i, f in enumerate(functions)]
    call = objects[0] if len(objects) == 1 else {"anyOf": objects}
    return {**call, "$defs": defs} if defs else call


def _marker(fmt: ToolFormat, marker: str) -> str:
    """The grammar of a call marker: its token where it is one added token of
    the model (``<[id]>``), else its text."""
    token = fmt.marker_token(marker)
    return f"<[{token}]>" if token is not None else _quote(marker)


def _hermes(fmt: ToolFormat, functions: list[dict[str, Any]]) -> str:
    # <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
    body = _json(_any_call(functions, "arguments"))
    return f'call: {_marker(fmt, fmt.start)} "\\n" body "\\n" {_marker(fmt, fmt.end)}\nbody: {body}'


def _harmony(fmt: ToolFormat, functions: list[dict[str, Any]]) -> str:
    # The generation prompt ends in <|start|>assistant; gpt-oss's template renders a call as
    #  to=functions.NAME<|channel|>commentary json<|message|>{...}<|call|>
    # and its reasoning before it as <|channel|>analysis<|message|>...<|end|><|start|>assistant:
    # the model may reason first, as it does unforced (a budget ends the analysis
    # by forcing <|end|>, mlxd.engine.reasoning_budget).
    rules = [
        f"fn{i}: {_quote(' to=functions.' + f['name'])} {_marker(fmt, fmt.start)} \"commentary json\" "
        f"{_marker(fmt, '<|message|>')} args{i}\nargs{i}: {_json(f['parameters'])}"
        for i, f in enumerate(functions)
    ]
    names = " | ".join(f"fn{i}" for i in range(len(functions)))
    # The analysis text holds no special token: none of harmony's markup can hide in it.
    analysis = (
        f"analysis: {_spelled(fmt, HARMONY_ANALYSIS)} thought {_marker(fmt, '<|end|>')} "
        f'{_marker(fmt, "<|start|>")} "assistant"\nthought: /(.|\\n)*/'
    )
    return f"call: analysis? ({names}) {_marker(fmt, fmt.end)}\n{analysis}\n" + "\n".join(rules)


def _spelled(fmt: ToolFormat, markup: str) -> str:
    """``markup`` as the model's own tokens where the format knows them, else its text."""
    ids = fmt.spelling(markup)
    return " ".join(f"<[{i}]>" for i in ids) if ids else _quote(markup)


def _llama3(fmt: ToolFormat, functions: list[dict[str, Any]]) -> str:
    return f"call: {_json(_any_call(functions, 'parameters'))}"


def _mistral(fmt: ToolFormat, functions: list[dict[str, Any]]) -> str:
    if "[ARGS]" in fmt.template:
        # Newer templates: [TOOL_CALLS]name[ARGS]{...}
        rules = [
            f"fn{i}: {_quote(f['name'])} {_marker(fmt, '[ARGS]')} args{i}\nargs{i}: {_json(f['parameters'])}"
            for i, f in enumerate(functions)
        ]
        names = " | ".join(f"fn{i}" for i in range(len(functions)))
        return f"call: {_marker(fmt, fmt.start)} ({names})\n" + "\n".join(rules)
    # Older ones: [TOOL_CALLS][{"name": ..., "arguments": {...}}]
    return f'call: {_marker(fmt, fmt.start)} "[" body "]"\nbody: {_json(_any_call(functions, "arguments"))}'


def _qwen3_coder(fmt: ToolFormat, functions: list[dict[str, Any]]) -> str:
    # <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>
    rules: list[str] = []
    alternatives = []
    for i, function in enumerate(functions):
        schema = function["parameters"]
        properties = schema.get("properties") or {}
        required = set(schema.get("required") or ())
        parts = []
        for j, (param, sub) in enumerate(properties.items()):
            rule = f"p{i}_{j}"
            open_tag = _quote(f"<parameter={param}>\n")
            rules.append(f"{rule}: {open_tag} {rule}_v {_quote(chr(10) + '</parameter>' + chr(10))}")
            rules.append(f"{rule}_v: {_xml_value(_with_root(schema, sub if isinstance(sub, dict) else {}))}")
            parts.append(rule if param in required else f"{rule}?")
        head = _quote(f"<function={function['name']}>\n")
        rules.append(f"fn{i}: {head} {' '.join(parts)} {_quote('</function>')}")
        alternatives.append(f"fn{i}")
    start, end = _marker(fmt, fmt.start), _marker(fmt, fmt.end)
    return f'call: {start} "\\n" ({" | ".join(alternatives)}) "\\n" {end}\n' + "\n".join(rules)


def _with_root(root: dict[str, Any], sub: dict[str, Any]) -> dict[str, Any]:
    """A parameter's own schema, compiled alone, with what its ``$ref``
    pointers name: the whole parameters schema rides along under ``$defs``."""
    if not _has_refs(sub):
        return sub
    slot = "mlxd_params"
    # Pointers are relative to the document's root, never to a subschema,
    # so rebasing every one onto the slot also covers a ``$defs`` of ``sub``.
    return {**_rebased(sub, f"#/$defs/{slot}"), "$defs": {slot: _rebased(root, f"#/$defs/{slot}")}}


def _xml_value(schema: dict[str, Any]) -> str:
    """A parameter's value as qwen3_coder's parser reads it back: strings
    raw, everything else as JSON."""
    enum = schema.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
        return " | ".join(_quote(v) for v in enum)
    if schema.get("type") == "string":
        limit = schema.get("maxLength")
        bound = f"{{0,{int(limit)}}}" if isinstance(limit, int) and limit >= 0 else "*"
        # No "<" so the value cannot swallow the closing tag; no newline at
        # its edges (the parser strips one).
        return f"/[^<\\n]{bound}/"
    return _json(schema)


def _glm47(fmt: ToolFormat, functions: list[dict[str, Any]]) -> str:
    # <tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>...</tool_call>,
    # values raw for strings and JSON otherwise, as glm47's parser reads them.
    key_open, key_close = _marker(fmt, "<arg_key>"), _marker(fmt, "</arg_key>")
    value_open, value_close = _marker(fmt, "<arg_value>"), _marker(fmt, "</arg_value>")
    rules: list[str] = []
    alternatives = []
    for i, function in enumerate(functions):
        parts = []
        for j, (param, sub, required) in enumerate(_parameters(function)):
            rule = f"p{i}_{j}"
            rules.append(
                f'{rule}: "\\n" {key_open} {_quote(param)} {key_close} "\\n" {value_open} {rule}_v {value_close}'
            )
            rules.append(f"{rule}_v: {_xml_value(sub)}")
            parts.append(rule if required else f"{rule}?")
        rules.append(f"fn{i}: {_quote(function['name'])} {' '.join(parts)}")
        alternatives.append(f"fn{i}")
    start, end = _marker(fmt, fmt.start), _marker(fmt, fmt.end)
    return f"call: {start} ({' | '.join(alternatives)}) {end}\n" + "\n".join(rules)


def _pythonic(fmt: ToolFormat, functions: list[dict[str, Any]]) -> str:
    # <|tool_call_start|>[name(key=value, ...)]<|tool_call_end|>; a JSON value
    # is a Python literal to the parser (which reads true/false/null too).
    calls, rules = _argument_lists(functions, "{}(", lambda param, sub: f"{_quote(param + '=')} {_json(sub)}", ", ", ")")
    return f'call: {_marker(fmt, fmt.start)} "[" {calls} "]" {_marker(fmt, fmt.end)}\n{rules}'


def _gemma4(fmt: ToolFormat, functions: list[dict[str, Any]]) -> str:
    # <|tool_call>call:name{key:value,...}<tool_call|>: bare keys, strings
    # between <|"|> tokens, other values JSON (the parser turns it into JSON).
    quote = _marker(fmt, '<|"|>')

    def argument(param: str, sub: dict[str, Any]) -> str:
        value = f"{quote} ({_xml_value(sub)}) {quote}" if _is_string(sub) else _json(sub)
        return f"{_quote(param + ':')} {value}"

    calls, rules = _argument_lists(functions, "call:{}{{", argument, ",", "}")
    return f"call: {_marker(fmt, fmt.start)} {calls} {_marker(fmt, fmt.end)}\n{rules}"


def _argument_lists(
    functions: list[dict[str, Any]], opening: str, argument: Any, sep: str, closing: str
) -> tuple[str, str]:
    """``(fn0 | fn1 ...)`` and the rules of each: ``opening`` (formatted with
    the function's name), its arguments ``sep``-separated, ``closing``."""
    rules: list[str] = []
    for i, function in enumerate(functions):
        items = []
        for j, (param, sub, required) in enumerate(_parameters(function)):
            rules.append(f"p{i}_{j}: {argument(param, sub)}")
            items.append((f"p{i}_{j}", required))
        arguments = _comma_list(items, _quote(sep))
        rules.append(f"fn{i}: {_quote(opening.format(function['name']))} {arguments} {_quote(closing)}")
    return f"({' | '.join(f'fn{i}' for i in range(len(functions)))})", "\n".join(rules)


def _parameters(function: dict[str, Any]) -> list[tuple[str, dict[str, Any], bool]]:
    """(name, schema, required) of a function's parameters, in schema order."""
    schema = function["parameters"]
    required = set(schema.get("required") or ())
    properties = schema.get("properties") or {}
    return [(name, sub if isinstance(sub, dict) else {}, name in required) for name, sub in properties.items()]


def _is_string(schema: dict[str, Any]) -> bool:
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return all(isinstance(v, str) for v in enum)
    return schema.get("type") == "string"


def _comma_list(items: list[tuple[str, bool]], sep: str, first: bool = True) -> str:
    """The grammar of ``items`` in order, ``sep`` between those present, the
    optional ones (required False) left out or not."""
    if not items:
        return ""
    (rule, required), rest = items[0], items[1:]
    head = rule if first else f"{sep} {rule}"
    after = _comma_list(rest, sep, first=False)
    with_it = f"{head} {after}".strip()
    if required:
        return with_it
    if not first:
        return f"({head})? {after}".strip()
    without = _comma_list(rest, sep, first=True)
    return f"({with_it} | {without})" if without else f"({with_it})?"
