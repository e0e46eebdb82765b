"""The YAML of ``models.yaml`` as a node tree that knows every line.

The file is composed into nodes once; pydantic's error locations and the
loader's own cross-key checks are both located by walking that tree, so
every :class:`~mlxd.errors.ConfigError` names the file, the 1-based line
and the dotted key (``models[1].max_context``).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import ValidationError

from mlxd.errors import ConfigError
from mlxd.registry.schema import KINDS_TABLE, PHYSICAL_MEMORY, RegistryFile, section_for_path

Loc = tuple[str | int, ...]

_SECRET_KEYS = frozenset({"api_keys", "read_only_keys", "key", "key_sha256"})


@dataclass(frozen=True)
class Document:
    """The parsed file: its data and the node tree that knows every line."""

    label: str
    root: yaml.Node
    data: Any

    @classmethod
    def parse(cls, text: str, label: str) -> Document:
        loader = yaml.SafeLoader(text)
        try:
            root = loader.get_single_node()
            if root is None:
                raise ConfigError(
                    "the file is empty; it needs at least a `models` list", file=label, line=1
                )
            _reject_duplicate_keys(root, label)
            data = loader.construct_document(root)
        except yaml.MarkedYAMLError as exc:
            raise ConfigError(f"YAML syntax error: {_syntax_problem(exc)}", file=label,
                              line=_syntax_line(exc)) from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"YAML error: {type(exc).__name__}", file=label) from None
        finally:
            loader.dispose()
        if not isinstance(data, dict):
            raise ConfigError(
                "the top level must be a mapping with `models` (and optionally "
                "`manager` and `server`)",
                file=label,
                line=root.start_mark.line + 1,
            )
        return cls(label, root, data)

    def line_of(self, loc: Loc) -> int:
        """The line of the deepest part of ``loc`` present in the file: a key's
        line for a mapping entry, the item's line for a list entry."""
        node = self.root
        line = node.start_mark.line + 1
        for part in loc:
            if isinstance(node, yaml.MappingNode) and isinstance(part, str):
                pair = _find_key(node, part)
                if pair is None:
                    break
                line = pair[0].start_mark.line + 1
                node = pair[1]
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
                if not 0 <= part < len(node.value):
                    break
                node = node.value[part]
                line = node.start_mark.line + 1
            else:
                break
        return line

    def written(self, loc: Loc) -> str | None:
        """The text of the scalar at ``loc`` as the file spells it (``yes``
        where YAML read True), or None when ``loc`` is not a scalar there."""
        node = self.root
        for part in loc:
            if isinstance(node, yaml.MappingNode) and isinstance(part, str):
                pair = _find_key(node, part)
                if pair is None:
                    return None
                node = pair[1]
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
                node = node.value[part]
            else:
                return None
        return node.value if isinstance(node, yaml.ScalarNode) else None

    def error(self, loc: Loc, message: str) -> ConfigError:
        return ConfigError(message, file=self.label, line=self.line_of(loc), key=key_path(loc))

    def validate(self, physical_memory: int, kinds: Mapping[str, Any]) -> RegistryFile:
        data = {
            k: ({} if v is None and k in ("server", "manager") else v) for k, v in self.data.items()
        }
        try:
            return RegistryFile.model_validate(data, context={PHYSICAL_MEMORY: physical_memory, KINDS_TABLE: kinds})
        except ValidationError as exc:
            errors = exc.errors()
        # The first problem in reading order, so fixing top-down converges; on
        # one line an unknown key goes first (it often explains a missing one).
        errors.sort(key=lambda e: (self.line_of(_data_loc(e)), e["type"] != "extra_forbidden"))
        problems = [self.error(_data_loc(e), _message(e, _data_loc(e), self.written(_data_loc(e)))) for e in errors]
        first, more = problems[0], len(problems) - 1
        if more:
            detail = (
                f"{first.detail} (and {more} more problem{'s' if more > 1 else ''} in this file)"
            )
            first = ConfigError(detail, file=first.file, line=first.line, key=first.key)
        raise first from None


def _data_loc(err: Mapping[str, Any]) -> Loc:
    return tuple(p for p in err["loc"] if isinstance(p, (str, int)))


def _find_key(node: yaml.MappingNode, key: str) -> tuple[yaml.Node, yaml.Node] | None:
    # Last wins: after a ``<<`` merge the explicit keys follow the merged ones.
    for key_node, value_node in reversed(node.value):
        if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
            return key_node, value_node
    return None


def _reject_duplicate_keys(root: yaml.Node, label: str) -> None:
    """PyYAML keeps the last of two equal keys silently; we refuse them."""
    stack: list[tuple[yaml.Node, Loc]] = [(root, ())]
    visited: set[int] = set()
    while stack:
        node, loc = stack.pop()
        if id(node) in visited:  # anchors and aliases make the tree a graph
            continue
        visited.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack.extend((item, (*loc, i)) for i, item in enumerate(node.value))
        if not isinstance(node, yaml.MappingNode):
            continue
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
            if key is None or key == "<<":
                continue
            stack.append((value_node, (*loc, key)))
            line = key_node.start_mark.line + 1
            if key in first_line:
                raise ConfigError(
                    f"`{key}` appears twice in this mapping (first on line {first_line[key]})",
                    file=label,
                    line=line,
                    key=key_path((*loc, key)),
                )
            first_line[key] = line


def key_path(loc: Loc) -> str | None:
    """``("models", 1, "max_context")`` -> ``models[1].max_context``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out or None


def _message(err: Mapping[str, Any], loc: Loc, written: str | None = None) -> str:
    """``written``: the scalar's text in the file, which a boolean's message
    quotes (``got yes``, not ``got True``: YAML 1.1 reads yes/no/on/off as
    booleans, and the reader looks for what they wrote)."""
    kind = err["type"]
    value = err.get("input")
    if isinstance(value, bool) and written is not None:
        said = (repr(value), str(value).lower())
        message = str(err["msg"])
        for word in said:
            message = message.replace(f"got {word}", f"got {written}")
        err = {**err, "msg": message, "input": _Written(written)}
    name = loc[-1] if loc else ""
    if kind == "extra_forbidden":
        return _unknown_key_message(str(name), loc[:-1])
    if kind == "missing":
        if loc == ("models",):
            return "the file needs a `models` list with at least one model"
        return f"required key `{name}` is missing"
    if kind == "too_short" and loc == ("models",):
        return "`models` is empty; list at least one model"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"expected a mapping of keys, got {_show(err.get('input'))}"
    if kind == "list_type":
        return f"expected a list, got {_show(err.get('input'))}"
    message = str(err["msg"]).removeprefix("Value error, ")
    if kind == "value_error":
        return message
    message = f"{message[:1].lower()}{message[1:]}"
    # Errors reach logs and /v1/status; never echo what may be a secret.
    if any(part in _SECRET_KEYS for part in loc):
        return message
    # Some messages say what they got in words (a number with a fractional
    # part): the value first, the words after it.
    head, _, about = message.partition(", got ")
    shown = f"{head}, got {_show(err.get('input'))}" + (f" ({about})" if about else "")
    if kind == "string_type" and isinstance(err.get("input"), _Written):
        return f"{shown} (YAML reads it as a boolean; write '{err['input']}' in quotes for the word)"
    return shown


class _Written(str):
    """A scalar shown as the file spells it, unquoted."""

    def __repr__(self) -> str:
        return str(self)


def _show(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return "a mapping" if isinstance(value, dict) else "a list"
    if value is None:
        return "nothing (null)"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _unknown_key_message(key: str, parent: Loc) -> str:
    section = section_for_path(parent)
    valid = sorted(section.model_fields) if section is not None else []
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    if close:
        return f"unknown key `{key}`; did you mean `{close[0]}`?"
    if valid:
        return f"unknown key `{key}`; valid keys here: {', '.join(valid)}"
    return f"unknown key `{key}`"


def _syntax_line(exc: yaml.MarkedYAMLError) -> int | None:
    """Where to look: where the parser gave up, but where what it was reading
    began when it gave up at the end of the file (an unclosed quote or
    bracket is reported at the last line, far from the mistake)."""
    mark = exc.problem_mark or exc.context_mark
    if exc.context_mark is not None and "end of stream" in (exc.problem or ""):
        mark = exc.context_mark
    return mark.line + 1 if mark is not None else None


def _syntax_problem(exc: yaml.MarkedYAMLError) -> str:
    problem = exc.problem or exc.context or "invalid YAML"
    if exc.problem and exc.context and exc.context_mark is not None:
        problem += f" ({exc.context} that starts on line {exc.context_mark.line + 1})"
    return problem
