"""GET /v1/models as the clients that discover models read it: the OpenAI
and Anthropic SDKs, Claude Code's gateway discovery (ids starting with
``claude``, ``display_name``, ``max_input_tokens``) and Codex's model
catalog (``model_catalog_url``, ``?client_version=``)."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest
from support.daemon import daemon_in_thread, write_registry

pytestmark = pytest.mark.mlx


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("listing")
    registry = write_registry(tmp, [
        {"name": "coder", "model": "qwen", "aliases": ["claude-*", "gpt-*", "local"], "max_context": 3000},
        {"name": "other", "model": "llama", "aliases": ["claude-other"]},
    ], server={"max_request_tokens": 2048})
    with daemon_in_thread(registry, tmp) as d:
        yield d


def test_pattern_aliases_are_listed_as_names_they_route(daemon):
    ids = [m.id for m in openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="x").models.list()]
    # No glob is a model a client can pick; `claude-coder` is, and reaches coder.
    assert ids == ["coder", "claude-coder", "gpt-coder", "local", "other", "claude-other"]
    reply = openai.OpenAI(base_url=f"{daemon.url}/v1", api_key="x").chat.completions.create(
        model="claude-coder", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert reply.model == "claude-coder"


def test_the_anthropic_sdk_reads_names_windows_and_output_caps(daemon):
    models = list(anthropic.Anthropic(base_url=daemon.url, api_key="x").models.list())
    by_id = {m.id: m for m in models}
    coder = by_id["claude-coder"]
    assert coder.type == "model" and coder.display_name == "coder (claude-coder)"
    assert coder.created_at.year >= 2024
    # The window is the registry's max_context; the output cap the server's limit within it.
    assert coder.max_input_tokens == 3000 and coder.max_tokens == 2048
    assert by_id["coder"].display_name == "coder"


def test_claude_codes_gateway_discovery_keeps_the_claude_names(daemon):
    # What its discovery asks (GET /v1/models?limit=1000, anthropic-version) and keeps.
    body = httpx.get(f"{daemon.url}/v1/models", params={"limit": 1000},
                     headers={"anthropic-version": "2023-06-01", "x-api-key": "x"}).json()
    kept = [m for m in body["data"] if m["id"].lower().startswith(("claude", "anthropic"))]
    assert [(m["id"], m["display_name"]) for m in kept] == [
        ("claude-coder", "coder (claude-coder)"), ("claude-other", "other (claude-other)")]
    assert body["has_more"] is False and body["first_id"] == "coder" and body["last_id"] == "claude-other"
    assert "models" not in body


def test_codex_reads_a_catalog_entry_for_each_name(daemon):
    body = httpx.get(f"{daemon.url}/v1/models", params={"client_version": "0.171.0"}).json()
    catalog = {m["slug"]: m for m in body["models"]}
    assert set(catalog) == {m["id"] for m in body["data"]}
    coder = catalog["gpt-coder"]
    assert coder["context_window"] == 3000 and coder["visibility"] == "list" and coder["supported_in_api"]
    assert coder["base_instructions"] and coder["truncation_policy"] == {"mode": "bytes", "limit": 10_000}
