"""The ``GET /v1/models`` document: one list that OpenAI's, Anthropic's and
the coding agents' model discovery each read.

- OpenAI clients read ``data[].id`` (and ``object``, ``created``, ``owned_by``).
- Anthropic's shape adds ``type``, ``display_name``, ``created_at``,
  ``max_input_tokens`` (the context window), ``max_tokens`` (the output cap)
  and the page fields ``has_more``, ``first_id``, ``last_id``. Claude Code's
  gateway discovery (``CLAUDE_CODE_ENABLE_GATEWAY_MODEL_DISCOVERY=1``) keeps
  only ids that start with ``claude`` or ``anthropic`` for its ``/model``
  picker, so a pattern alias such as ``claude-*`` is listed as a concrete name
  it routes (``claude-coder`` for the model ``coder``); a glob itself is no
  model a client can pick.
- Codex reads a model catalog from its provider's ``model_catalog_url``
  (``?client_version=...``): ``models[]`` with ``slug``, ``context_window``
  and the rest of its metadata. Without an entry for its model it warns
  "Model metadata for ... not found" and guesses; the catalog goes out only
  when that parameter asks for it.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from mlxd.registry.model import FailoverSpec, ModelSpec, Registry, is_pattern

# Codex's own base prompt (~17k characters) is written for OpenAI's models;
# a catalog entry replaces it, so this is what Codex sends a local model.
CODEX_INSTRUCTIONS = (
    "You are a coding agent running in the Codex CLI, a terminal-based coding assistant, "
    "on a local model served by mlxd. Use the tools you are given to read files, run commands "
    "and make changes in the user's workspace. Be precise and concise, and say what you did."
)


def listed_names(entry: ModelSpec | FailoverSpec, registry: Registry) -> list[str]:
    """The names a client can pick for ``entry``: its name, exact aliases, and
    one concrete name per pattern alias (``claude-*`` -> ``claude-NAME``)
    where the registry routes that name back to ``entry``."""
    names = []
    for name in entry.names():
        if is_pattern(name):
            name = name.replace("*", entry.name, 1)
            if is_pattern(name) or registry.find(name) is not entry:
                continue
        if name not in names:
            names.append(name)
    return names


def model_item(
    name: str, spec: ModelSpec, about: dict[str, Any], *, created: int, state: str, output_cap: int,
    root: str,
) -> dict[str, Any]:
    return {
        "id": name,
        "object": "model",
        "type": "model",
        "created": created,
        "created_at": datetime.fromtimestamp(created, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "display_name": name if name == root else f"{root} ({name})",
        "max_input_tokens": spec.max_context,
        "max_tokens": min(spec.max_context, output_cap),
        "root": root,
        **about,
        "state": state,
    }


def page(data: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "object": "list",
        "data": data,
        "has_more": False,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }


def codex_catalog(data: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Codex's ``ModelInfo`` for each listed name (its required fields, with
    the values Codex's own fallback metadata uses where mlxd knows no better)."""
    return [
        {
            "slug": item["id"],
            "display_name": item["display_name"],
            "description": f"{item['root']} on mlxd",
            "default_reasoning_level": None,
            "supported_reasoning_levels": [],
            "shell_type": "shell_command",
            "visibility": "list",
            "supported_in_api": True,
            "priority": priority,
            "upgrade": None,
            "base_instructions": CODEX_INSTRUCTIONS,
            # True: Codex then sends ``reasoning`` (its effort and ``summary: auto``),
            # and a thinking model's reasoning comes back as the summary it shows.
            "supports_reasoning_summaries": True,
            "support_verbosity": False,
            "default_verbosity": None,
            "apply_patch_tool_type": None,
            "truncation_policy": {"mode": "bytes", "limit": 10_000},
            "supports_parallel_tool_calls": True,
            "context_window": item["max_input_tokens"],
            "experimental_supported_tools": [],
            "input_modalities": ["text", "image"] if item.get("kind") == "vision" else ["text"],
        }
        for priority, item in enumerate(data)
    ]
