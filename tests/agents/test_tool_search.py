"""Tool search as Claude Code (2.1.337 and later) uses it, against a real
daemon: most of its tools are deferred (``defer_loading: true``, named in a
reminder), a ``ToolSearch`` tool finds them, and its result names what it
found in ``tool_reference`` blocks, the found tools then riding along in
``tools`` still deferred. A deferred tool stays out of the prompt's tool
list; what a search found is written into its tool result. So the prompt of
the turn after a search starts as the turn before did, and the prefix cache
serves it (it was recomputed whole when every tool was listed at the top),
and the model can call what it found. The prompt as the model saw it is read
back from request capture, with the zoo's Qwen3 (a real template that lists
tools in its system turn)."""

from __future__ import annotations

import anthropic
import httpx
import pytest
from agents.agents_support import KEY
from support.daemon import daemon_in_thread, write_registry
from zoo.zoo_support import zoo_model

pytestmark = pytest.mark.mlx

AUTH = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
SEARCH = {
    "name": "ToolSearch",
    "description": "Fetches full schema definitions for deferred tools so they can be called.",
    # (Closed strings: a random model forced into an open one never ends it.)
    "input_schema": {"type": "object", "properties": {"query": {"type": "string", "enum": ["select:WebFetch"]}},
                     "required": ["query"]},
}
BASH = {"name": "Bash", "description": "Runs a shell command.",
        "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}
FETCH_SCHEMA = {"type": "object", "properties": {"url": {"type": "string", "enum": ["https://example.com/"]}},
                "required": ["url"]}
FETCH = {"name": "WebFetch", "description": "Fetches a web page and reads it: unmistakable-fetch-description.",
         "input_schema": FETCH_SCHEMA, "defer_loading": True}
PLACEHOLDER = {"name": "DeferredToolPlaceholder", "description": "Reserved placeholder; never call this tool.",
               "input_schema": {"type": "object", "properties": {}}, "defer_loading": True}
ASK = [{"role": "user", "content": "Fetch https://example.com and summarise it."}]
SEARCHED = [
    *ASK,
    {"role": "assistant", "content": [
        {"type": "tool_use", "id": "toolu_search1", "name": "ToolSearch", "input": {"query": "select:WebFetch"}}]},
    {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_search1",
         "content": [{"type": "tool_reference", "tool_name": "WebFetch"}]},
        {"type": "text", "text": "Tool loaded."}]},
]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tool-search")
    registry = write_registry(tmp, [{"name": "qwen3", "path": str(zoo_model("qwen3"))}], server={"api_keys": [KEY]})
    with daemon_in_thread(registry, tmp) as d:
        assert httpx.put(f"{d.url}/v1/capture", json={"enabled": True}, headers=AUTH).status_code == 200
        yield d


def ask(daemon, **body) -> httpx.Response:
    # (The zoo's Qwen3 thinks first: a forced call then waits past its reasoning.)
    body = {"model": "qwen3", "max_tokens": 4, "temperature": 0, "thinking": {"type": "disabled"}, **body}
    return httpx.post(f"{daemon.url}/v1/messages", json=body, headers=AUTH, timeout=120)


def prompt_of(daemon, reply: httpx.Response) -> str:
    return httpx.get(f"{daemon.url}/v1/captures/{reply.json()['id']}", headers=AUTH).json()["prompt"]


def test_a_search_keeps_the_prompt_head_and_shows_the_found_tool_where_it_was_found(daemon):
    first = ask(daemon, tools=[SEARCH, BASH, FETCH, PLACEHOLDER], messages=ASK)
    assert first.status_code == 200, first.text
    before = prompt_of(daemon, first)
    assert "ToolSearch" in before and "Runs a shell command." in before
    # Deferred: not listed (the placeholder, which must never be called, neither).
    assert "unmistakable-fetch-description" not in before and "DeferredToolPlaceholder" not in before

    second = ask(daemon, tools=[SEARCH, BASH, FETCH, PLACEHOLDER], messages=SEARCHED)
    assert second.status_code == 200, second.text
    after = prompt_of(daemon, second)
    # The found tool's definition is in the search's result, once, after the call.
    assert after.count("unmistakable-fetch-description") == 1
    assert after.index("unmistakable-fetch-description") > after.index("select:WebFetch")
    assert '"name": "WebFetch"' in after and '"enum": ["https://example.com/"]' in after
    # Everything before the first answer is as it was: the cache serves it.
    head = before[: before.rindex("<|im_start|>assistant")]
    assert after.startswith(head)
    usage = second.json()["usage"]
    assert usage["cache_read_input_tokens"] >= first.json()["usage"]["input_tokens"] - 8, usage
    counted = httpx.post(f"{daemon.url}/v1/messages/count_tokens", headers=AUTH, json={
        "model": "qwen3", "tools": [SEARCH, BASH, FETCH, PLACEHOLDER], "messages": SEARCHED,
        "thinking": {"type": "disabled"}}).json()
    assert counted["input_tokens"] == usage["input_tokens"] + usage["cache_read_input_tokens"]


def test_the_model_calls_a_tool_its_search_found(daemon):
    # Through the official client, which types defer_loading and tool_reference.
    client = anthropic.Anthropic(base_url=daemon.url, api_key=KEY, max_retries=0)
    reply = client.messages.create(model="qwen3", max_tokens=80, tools=[SEARCH, FETCH, PLACEHOLDER], messages=SEARCHED,
                                   tool_choice={"type": "tool", "name": "WebFetch"}, thinking={"type": "disabled"},
                                   extra_body={"temperature": 0})
    (call,) = [b for b in reply.content if b.type == "tool_use"]
    assert (call.name, call.input) == ("WebFetch", {"url": "https://example.com/"})
    assert reply.stop_reason == "tool_use"


def test_a_forced_call_never_picks_a_deferred_tool_no_search_found(daemon):
    # `any` forces some call: of the tools the model was shown, ToolSearch only.
    # (Sampled, with tools that would otherwise each be called: more than
    # one was, in 12 samples, when all were listed.)
    names = set()
    for _ in range(12):
        reply = ask(daemon, tools=[FETCH, PLACEHOLDER, SEARCH], messages=ASK, max_tokens=60,
                    tool_choice={"type": "any"}, temperature=1.0)
        assert reply.status_code == 200, reply.text
        names |= {b["name"] for b in reply.json()["content"] if b["type"] == "tool_use"}
    assert names == {"ToolSearch"}


def test_bad_tool_search_bodies_are_anthropic_400s(daemon):
    unknown = [*SEARCHED[:2], {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_search1",
         "content": [{"type": "tool_reference", "tool_name": "Teleport"}]}]}]
    reply = ask(daemon, tools=[SEARCH, FETCH], messages=unknown)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and "`Teleport`" in error["message"]
    assert "messages[2].content[0].content[0]" in error["message"]

    all_deferred = ask(daemon, tools=[FETCH, PLACEHOLDER], messages=ASK)
    assert all_deferred.status_code == 400
    assert "at least one tool must not be deferred" in all_deferred.json()["error"]["message"]


def test_with_anthropics_own_tool_search_the_deferred_tools_are_listed(daemon):
    # A hosted search tool is a server tool mlxd does not run: the model's
    # only way to a deferred tool would be gone, so they are listed instead.
    hosted = {"type": "tool_search_tool_regex_20251119", "name": "tool_search_tool_regex"}
    reply = ask(daemon, tools=[hosted, BASH, FETCH], messages=ASK)
    assert reply.status_code == 200, reply.text
    assert "unmistakable-fetch-description" in prompt_of(daemon, reply)
    # Every custom tool deferred is then no refusal either.
    assert ask(daemon, tools=[hosted, FETCH], messages=ASK).status_code == 200
