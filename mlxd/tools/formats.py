"""The tool-call format a model writes, and the parser for it.

Parsers are mlx-lm's own (``mlx_lm/tool_parsers/``), picked as mlx-lm picks
them (``tool_parser_type`` in ``tokenizer_config.json``, else inferred from
the chat template). mlx-lm has no parser for Llama 3's bare JSON calls, so
``llama3_json`` (``mlxd.tools.llama3``) is ours. The registry's
``tool_parser:`` overrides the guess; ``none`` turns tool calling off.

A template that has no place for tools at all (plain ChatML, SmolLM2's)
gets ``json_tools`` (``DEFAULT``): agents send tools on every request, and a
400 on each left such a model unusable by them. mlxd writes the tools into
its prompt in that convention itself (``mlxd.tools.fallback``), so the
prompt and the parser agree; ``<tool_call>`` JSON is what most open chat
models were tuned on (Hermes, Qwen 2.5, SmolLM2's function-calling data). A
template that renders tools in a markup mlxd has no parser for keeps no
format: its calls could not be read back.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxd.errors import BadRequest
from mlxd.files import read_json_object
from mlxd.tools.fallback import renders_tools

# Formats of our own, next to mlx-lm's modules.
LLAMA3_JSON = "llama3_json"
# gpt-oss: calls are harmony messages to ``functions.NAME`` (mlxd.tools.harmony).
HARMONY = "harmony"
NONE = "none"
# The header of gpt-oss's reasoning message.
HARMONY_ANALYSIS = "<|channel|>analysis<|message|>"
# The special tokens harmony is written in: a vocabulary with them all is gpt-oss's.
HARMONY_TOKENS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>")
# The format of a model whose template names none (see the module docstring).
DEFAULT = "json_tools"


@dataclass(frozen=True)
class ToolFormat:
    """How one model family writes tool calls."""

    name: str
    # The markup that opens a call. Empty: a call is the whole answer (Llama 3).
    start: str
    # The markup that closes it. Empty: the call runs to the end of the answer (Mistral).
    end: str
    # mlx-lm's signature: (call text between the markers, tools) -> call or list of calls,
    # each {"name", "arguments": dict, optional "id"}; raises ValueError when it cannot.
    parse: Callable[[str, Any], Any]
    # The chat template, for details of a family's forced-call shape (Mistral's [ARGS]).
    template: str = ""
    # The markers that are one added token of this model (Qwen3's <tool_call>,
    # Mistral's [TOOL_CALLS]), with its id: a forcing grammar must name the
    # token, since llguidance holds every added token as a special token
    # that the marker's text never matches.
    marker_tokens: tuple[tuple[str, int], ...] = ()
    # Markup a forcing grammar writes as this model's own token ids, so the
    # ids a reasoning phase follows are the ones written (gpt-oss's analysis
    # header: its text could be spelled in other tokens).
    spellings: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def marker_token(self, marker: str) -> int | None:
        return dict(self.marker_tokens).get(marker)

    def spelling(self, markup: str) -> tuple[int, ...]:
        return dict(self.spellings).get(markup, ())


def known_parsers() -> list[str]:
    """Every value ``tool_parser:`` accepts. Does not import mlx-lm (the
    registry is validated without it)."""
    spec = importlib.util.find_spec("mlx_lm")
    folders = [str(Path(p) / "tool_parsers") for p in (spec.submodule_search_locations or [])] if spec else []
    names = [m.name for m in pkgutil.iter_modules(folders)]
    return sorted([*names, LLAMA3_JSON, HARMONY, NONE])


def format_named(name: str, template: str = "") -> ToolFormat:
    if name == LLAMA3_JSON:
        from mlxd.tools import llama3

        return ToolFormat(name, "", "", llama3.parse_tool_call, template)
    if name == HARMONY:
        from mlxd.tools import harmony

        # The markers are never searched for: harmony's channels are parsed whole.
        return ToolFormat(name, "<|channel|>", "<|call|>", harmony.parse_tool_call, template)
    if name not in known_parsers():
        raise ValueError(f"unknown tool parser {name!r}; choose from {', '.join(known_parsers())}")
    module = importlib.import_module(f"mlx_lm.tool_parsers.{name}")
    return ToolFormat(name, module.tool_call_start, module.tool_call_end or "", module.parse_tool_call, template)


def guess_name(chat_template: Any, vocab: Any, configured: str | None = None) -> str | None:
    """The parser mlx-lm would pick, else ours for Llama 3; None when the template names none."""
    if configured:
        return configured
    from mlx_lm.tokenizer_utils import _infer_tool_parser

    probe = _TemplateProbe(chat_template, vocab)
    name = _infer_tool_parser(probe)
    if name is None and isinstance(chat_template, str) and _looks_like_llama3(chat_template):
        name = LLAMA3_JSON
    if name is None and _is_harmony(vocab or {}):
        name = HARMONY
    return name


def resolve(tokenizer: Any, override: str | None = None) -> ToolFormat | None:
    """The format of a loaded model (mlx-lm ``TokenizerWrapper``)."""
    if override == NONE:
        return None
    template = getattr(tokenizer, "chat_template", None)
    template = template if isinstance(template, str) else ""
    if override:
        fmt = format_named(override, template)
    elif (parser := getattr(tokenizer, "tool_parser", None)) is not None:
        # mlx-lm already chose one while loading.
        name = getattr(parser, "__module__", "").rsplit(".", 1)[-1]
        fmt = ToolFormat(name, tokenizer.tool_call_start, tokenizer.tool_call_end or "", parser, template)
    elif _looks_like_llama3(template):
        fmt = format_named(LLAMA3_JSON, template)
    elif _is_harmony(vocab_of(tokenizer)):
        fmt = format_named(HARMONY, template)
    elif not renders_tools(template):
        fmt = format_named(DEFAULT, template)
    else:
        # The template renders tools in a markup mlxd cannot read back.
        return None
    markers = (fmt.start, fmt.end, *_INNER_MARKERS.get(fmt.name, ()))
    spellings = tuple((m, encoded(tokenizer, m)) for m in _SPELLED.get(fmt.name, ()))
    return dataclasses.replace(
        fmt, marker_tokens=_marker_tokens(tokenizer, markers), spellings=tuple(s for s in spellings if s[1])
    )


# Markup inside a call that the families' tokenizers hold as added tokens.
_INNER_MARKERS = {
    "glm47": ("<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"),
    "gemma4": ('<|"|>',),
    "mistral": ("[ARGS]",),
    HARMONY: ("<|message|>", "<|end|>", "<|start|>"),
}


# Markup a forcing grammar spells in the model's tokens (see ToolFormat.spellings).
_SPELLED = {HARMONY: (HARMONY_ANALYSIS,)}


def encoded(tokenizer: Any, text: str) -> tuple[int, ...]:
    """``text`` as the model's token ids (none when there is no tokenizer to ask)."""
    try:
        return tuple(tokenizer.encode(text, add_special_tokens=False))
    except (AttributeError, TypeError, ValueError):
        return ()


def _marker_tokens(tokenizer: Any, markers: tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    get_added = getattr(tokenizer, "get_added_vocab", None)
    added = get_added() if callable(get_added) else {}
    return tuple((m, added[m]) for m in markers if m and isinstance(added.get(m), int))


@dataclass(frozen=True)
class FolderFormat:
    """What ``mlxd check`` says of a model folder's tool calls, without loading it."""

    # None: tool calling is off (``tool_parser: none``).
    name: str | None
    # "tool_parser:", "guessed from the chat template" or "mlxd's default".
    source: str
    # Whether the chat template renders tools (else mlxd writes them into the prompt).
    template_renders_tools: bool


def resolve_from_files(model_dir: Path, override: str | None = None) -> FolderFormat:
    """The format a model folder gets, without loading it (``mlxd check``)."""
    template, vocab, configured = _template_from_files(model_dir)
    renders = renders_tools(template)
    if override:
        return FolderFormat(None if override == NONE else override, "tool_parser:", renders)
    guessed = guess_name(template, vocab, configured)
    if guessed is not None:
        return FolderFormat(guessed, "guessed from the chat template", renders)
    return FolderFormat(None if renders else DEFAULT, "mlxd's default", renders)


def _template_from_files(model_dir: Path) -> tuple[Any, dict[str, Any], str | None]:
    config = read_json_object(model_dir / "tokenizer_config.json")
    template: Any = config.get("chat_template")
    jinja = model_dir / "chat_template.jinja"
    if template is None and jinja.is_file():
        template = jinja.read_text(encoding="utf-8", errors="replace")
    if isinstance(template, list):  # named templates: mlx-lm uses "default"
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    added = read_json_object(model_dir / "tokenizer.json").get("added_tokens") or []
    vocab = {t.get("content"): t.get("id") for t in added if isinstance(t, dict)}
    return template, vocab, config.get("tool_parser_type")


def require(fmt: ToolFormat | None, model: str) -> ToolFormat:
    """The format, or the 400 that tells the client why ``tools`` cannot work here."""
    if fmt is None:
        raise BadRequest(
            f"The model `{model}` has no tool-call format mlxd can use (`tool_parser: none`, or "
            f"a chat template that writes calls in a markup mlxd cannot parse). Set `tool_parser:` "
            f"for it in the registry to one of: "
            f"{', '.join(p for p in known_parsers() if p != NONE)}.",
            param="tools",
        )
    return fmt


class _TemplateProbe:
    """What mlx-lm's inference reads from a tokenizer: its template and vocabulary."""

    def __init__(self, chat_template: Any, vocab: Any) -> None:
        self.chat_template = chat_template
        self._vocab = vocab or {}

    def get_vocab(self) -> Any:
        return self._vocab


def _looks_like_llama3(template: str) -> bool:
    # Llama 3.1-3.3 templates: tools as JSON in the prompt, calls answered as
    # {"name": ..., "parameters": ...} (built-in tools after <|python_tag|>).
    return "<|python_tag|>" in template or (
        "<|start_header_id|>" in template and '"parameters"' in template
    )


def _is_harmony(vocab: Any) -> bool:
    return isinstance(vocab, dict) and all(t in vocab for t in HARMONY_TOKENS)


def vocab_of(tokenizer: Any) -> dict[str, Any]:
    """The tokenizer's vocabulary ({} when it has none to give)."""
    try:
        vocab = tokenizer.get_vocab()
    except (AttributeError, TypeError):
        return {}
    return vocab if isinstance(vocab, dict) else {}
