"""Documents attached to a message (Anthropic's ``document`` and
``search_result`` blocks, the Responses API's ``input_file`` parts) as the
text the model reads.

Text goes in whole, under its title. What mlxd cannot read (a PDF, a file
by id or by URL) becomes a line that says a file was attached and could not
be read: left out silently, the model answered as if nothing had been sent
(a question about an attached document got an answer made up without it),
and refused with a 400, every later turn of a conversation that holds it
would fail too (Claude Code keeps a PDF it read in its history).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

# Anthropic's block types that hold a document's text (or say it cannot be read).
DOCUMENTS = ("document", "search_result")
# What a text file's media type may be, besides text/*.
TEXT_TYPES = ("application/json", "application/xml", "application/x-yaml", "application/yaml",
              "application/javascript", "application/x-python", "application/sql", "application/toml")


def document_text(text: str, title: str | None = None, context: str | None = None) -> str:
    """A readable document's text, under its title and context when given."""
    head = [line for line in (title and f"Document: {title}", context) if line]
    return "\n".join([*head, text]) if head else text


def unreadable(what: str, title: str | None = None) -> str:
    """The line a file the server cannot read becomes (``what``: its media
    type or how it was given), so that the model can say it has not seen it."""
    named = f" `{title}`" if title else ""
    return f"[A file{named} ({what}) was attached here; this server cannot read it, so its content is not shown.]"


def is_text_type(media_type: str | None) -> bool:
    kind = (media_type or "").split(";")[0].strip().lower()
    return kind.startswith("text/") or kind in TEXT_TYPES


def decoded_text(data: str) -> str | None:
    """Base64 ``data`` (a data: URL or the bare encoding) as UTF-8 text, or
    None where it is neither."""
    if data.startswith("data:"):
        _, _, data = data.partition(",")
    try:
        return base64.b64decode(data, validate=True).decode("utf-8")
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return None


def data_url_type(data: str) -> str | None:
    """The media type a data: URL names, if it is one."""
    if not data.startswith("data:"):
        return None
    return data[5:].split(",", 1)[0].split(";", 1)[0] or None


def anthropic_document(block: dict[str, Any]) -> str:
    """An Anthropic ``document`` block (its source ``text``, ``content``,
    ``base64``, ``url`` or ``file``) or ``search_result`` block, as text."""
    title = _string(block.get("title"))
    context = _string(block.get("context"))
    if block.get("type") == "search_result":
        source = _string(block.get("source"))
        return document_text(_texts(block.get("content")), title, source)
    source = block.get("source") if isinstance(block.get("source"), dict) else {}
    kind, media_type = source.get("type"), _string(source.get("media_type"))
    if kind == "text" and isinstance(source.get("data"), str):
        return document_text(source["data"], title, context)
    if kind == "content":
        content = source.get("content")
        return document_text(content if isinstance(content, str) else _texts(content), title, context)
    if kind == "base64" and isinstance(source.get("data"), str) and is_text_type(media_type):
        text = decoded_text(source["data"])
        if text is not None:
            return document_text(text, title, context)
    return unreadable(media_type or f"a document by {kind or 'an unknown source'}", title)


def input_file(part: dict[str, Any]) -> str:
    """A Responses ``input_file`` part (``file_data``, ``file_id`` or ``file_url``) as text."""
    name = _string(part.get("filename"))
    data = part.get("file_data")
    if isinstance(data, str):
        media_type = data_url_type(data)
        if media_type is None or is_text_type(media_type):
            text = decoded_text(data)
            if text is not None:
                return document_text(text, name)
        return unreadable(media_type or "not text", name)
    given = "a file_id" if part.get("file_id") else "a file_url" if part.get("file_url") else "no file_data"
    return unreadable(f"by {given}", name)


def _texts(content: Any) -> str:
    if not isinstance(content, list):
        return ""
    return "\n".join(str(b.get("text", "")) for b in content if isinstance(b, dict) and b.get("type") == "text")


def _string(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None
