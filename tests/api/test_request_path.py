"""The HTTP request path with a scripted engine, no model and no server: the
app from build_daemon, driven over ASGI. Racing against deadlines and client
disconnects, stream framing, and the error bodies a client sees."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from support.asgi import Call, running
from support.residency_sim import manager, spec

from mlxd.api.openai.bodies import chat_tool_choice, chat_tools
from mlxd.api.plan import Plan, for_target
from mlxd.tools.output_request import OutputRequest
from mlxd.daemon.build import build_daemon
from mlxd.engine.contract import AnswerFormats, GenerationEngine
from mlxd.engine.local_output import shape_locally
from mlxd.engine.types import GenerationChunk, GenerationRequest
from mlxd.registry.model import Registry, ServerSpec
from mlxd.settings import DaemonSettings
from mlxd.tools.formats import format_named
from support.idle_lifecycle import IdleLifecycle

pytestmark = pytest.mark.anyio

CHAT = [{"role": "user", "content": "Say hello"}]
FOREVER = 3600.0


@pytest.fixture
def anyio_backend():
    return "asyncio"


class ScriptedEngine(IdleLifecycle, GenerationEngine):
    """Plays a script per request after accepting it: text pieces, pauses, a
    finish reason or an exception. Remembers what it was asked and which
    generations were closed. Its output is settled as a local engine's, over
    ``tool_format`` (none unless a test sets one), with no grammar compiled."""

    kind = "text"
    measured_bytes = None
    batching = False
    wants_image_urls = False

    def __init__(self, name: str, script: list[Any]) -> None:
        self.name = name
        self.script = script
        self.requests: list[GenerationRequest] = []
        self.closed: list[str] = []
        self.started = asyncio.Event()
        self.tool_format = None

    async def prepare(self, requests: list[GenerationRequest], output: OutputRequest, name: str) -> AnswerFormats:
        return shape_locally(requests, output, name, self.tool_format)

    async def generate(self, request: GenerationRequest):
        self.requests.append(request)
        self.started.set()
        produced = 0
        try:
            yield GenerationChunk("")  # accepted
            for step in self.script:
                if isinstance(step, float):
                    await asyncio.sleep(step)
                elif isinstance(step, BaseException):
                    raise step
                elif step in ("stop", "length", "abort"):
                    yield GenerationChunk("", finish_reason=step, prompt_tokens=5,
                                          completion_tokens=produced, cached_tokens=3)
                    return
                else:
                    produced += 1
                    yield GenerationChunk(step, completion_tokens=produced)
        finally:
            self.closed.append(request.request_id)

class Harness:
    def __init__(self, tmp_path: Path, script: list[Any], *, request_timeout_s: float = 30.0,
                 heartbeat_seconds: float = 5.0, max_concurrency: int = 1, **server: Any) -> None:
        self.engine = ScriptedEngine("m", script)

        async def engines(model_spec, registry):
            return self.engine

        registry = Registry(
            source_path=None, file_hash="x", manager=manager(8),
            server=ServerSpec(request_timeout_s=request_timeout_s, **server),
            models=(spec("m", 1, aliases=("alias",), max_concurrency=max_concurrency),
                    spec("eyes", 1, kind="vision")),
        )
        settings = DaemonSettings(state_dir=tmp_path / "state", watch_config=False,
                                  heartbeat_seconds=heartbeat_seconds)
        self.daemon = build_daemon(settings, registry, engines=engines)
        self.app = self.daemon.app

    def post(self, path: str, body: Any) -> Call:
        return Call(self.app, "POST", path, body)

    def chat(self, **body: Any) -> Call:
        return self.post("/v1/chat/completions", {"model": "m", "messages": CHAT, **body})

    def active(self) -> int:
        return self.daemon.ctx.manager.view("m").active

    def counted(self, status: int) -> float:
        value = self.daemon.ctx.metrics.registry.get_sample_value(
            "mlxd_requests_total", {"model": "m", "status": str(status)})
        return value or 0.0


def frames(text: str) -> list[Any]:
    """The stream's frames: JSON objects, "[DONE]", or "heartbeat" comments."""
    assert text.endswith("\n\n"), text
    out = []
    for frame in text.split("\n\n")[:-1]:
        if frame.startswith(": heartbeat"):
            out.append("heartbeat")
            continue
        assert frame.startswith("data: ") and "\n" not in frame, frame
        data = frame[len("data: "):]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


async def settled(predicate, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


# --- answers ------------------------------------------------------------------


async def test_a_chat_answer_carries_the_text_finish_reason_and_usage(tmp_path):
    h = Harness(tmp_path, ["Hello", " world", "stop"])
    async with running(h.app):
        call = await h.post("/v1/chat/completions", {
            "model": "alias", "messages": [{"role": "developer", "content": "Be brief"}, *CHAT],
        }).done()
    assert call.status == 200
    body = call.json()
    assert body["object"] == "chat.completion" and body["model"] == "alias"
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "Hello world"},
                                "finish_reason": "stop", "logprobs": None}]
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7,
                             "prompt_tokens_details": {"cached_tokens": 3},
                             "completion_tokens_details": {"reasoning_tokens": 0}}
    assert h.engine.requests[0].messages == [{"role": "system", "content": "Be brief"}, *CHAT]
    assert h.active() == 0 and h.counted(200) == 1


async def test_completions_answer_one_choice_per_prompt(tmp_path):
    h = Harness(tmp_path, ["ok", "length"])
    async with running(h.app):
        call = await h.post("/v1/completions", {"model": "m", "prompt": ["a", "b"], "max_tokens": 1}).done()
    body = call.json()
    assert [(c["index"], c["text"], c["finish_reason"]) for c in body["choices"]] == [(0, "ok", "length"), (1, "ok", "length")]
    assert body["usage"]["prompt_tokens"] == 10 and body["usage"]["completion_tokens"] == 2
    assert [r.prompt for r in h.engine.requests] == ["a", "b"]


# --- streams ------------------------------------------------------------------


async def test_a_chat_stream_is_role_then_deltas_then_finish_usage_and_done(tmp_path):
    h = Harness(tmp_path, ["Hel", 0.05, "lo", "stop"])
    async with running(h.app):
        call = await h.chat(stream=True, stream_options={"include_usage": True}).done()
    assert call.status == 200 and call.headers["content-type"].startswith("text/event-stream")
    got = frames(call.text)
    assert [f["choices"][0]["delta"] if f["choices"] else "usage" for f in got[:-1]] == [
        {"role": "assistant", "content": ""}, {"content": "Hel"}, {"content": "lo"}, {}, "usage"]
    assert got[3]["choices"][0]["finish_reason"] == "stop"
    assert got[4]["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7,
                               "prompt_tokens_details": {"cached_tokens": 3},
                               "completion_tokens_details": {"reasoning_tokens": 0}}
    assert got[-1] == "[DONE]"
    assert {f["id"] for f in got[:-1]} == {got[0]["id"]} and got[0]["object"] == "chat.completion.chunk"
    assert h.active() == 0 and h.counted(200) == 1
    # Usage once, in the last chunk: never on the finish chunk, where clients that add up chunks counted it twice.
    assert [f for f in got[:-1] if "usage" in f] == [got[4]]


async def test_a_stream_not_asked_for_usage_carries_none(tmp_path):
    h = Harness(tmp_path, ["Hel", "lo", "stop"])
    async with running(h.app):
        call = await h.chat(stream=True).done()
    got = frames(call.text)
    assert got[-1] == "[DONE]" and got[-2]["choices"][0]["finish_reason"] == "stop"
    assert not [f for f in got[:-1] if "usage" in f]


async def test_a_completions_stream_numbers_its_choices(tmp_path):
    h = Harness(tmp_path, ["x", "stop"])
    async with running(h.app):
        call = await h.post("/v1/completions", {"model": "m", "prompt": ["a", "b"], "stream": True}).done()
    got = frames(call.text)
    assert [(f["choices"][0]["index"], f["choices"][0]["text"], f["choices"][0]["finish_reason"])
            for f in got[:-1]] == [(0, "x", None), (0, "", "stop"), (1, "x", None), (1, "", "stop")]
    assert got[-1] == "[DONE]"


TRICKY = ['say "hi"\n', "back\\slash\t", "\x00\x1f", "é€😀", "\u2028</script>"]


@pytest.mark.parametrize("chat", [True, False])
async def test_streamed_text_reaches_the_client_exactly_in_openai_chunks(tmp_path, chat):
    # Quotes, escapes, control and non-ASCII characters, as a model may write them.
    h = Harness(tmp_path, [*TRICKY, "stop"])
    async with running(h.app):
        call = await (h.chat(stream=True) if chat else
                      h.post("/v1/completions", {"model": "m", "prompt": "x", "stream": True})).done()
    got = [f for f in frames(call.text)[:-1] if f["choices"][0]["finish_reason"] is None]
    if chat:
        got = got[1:]  # the role frame
    pieces = [f["choices"][0]["delta"]["content"] if chat else f["choices"][0]["text"] for f in got]
    assert pieces == TRICKY
    kind = "chat.completion.chunk" if chat else "text_completion"
    first = got[0]
    assert list(first) == ["id", "object", "created", "model", "choices"] and first["object"] == kind
    assert first["choices"][0]["index"] == 0 and first["choices"][0]["logprobs"] is None
    # Non-ASCII text travels as UTF-8, not as escapes.
    assert "é€😀" in call.text


async def test_heartbeats_flow_while_the_engine_is_silent(tmp_path):
    h = Harness(tmp_path, [0.35, "late", "stop"], heartbeat_seconds=0.05)
    async with running(h.app):
        call = await h.chat(stream=True).done()
    got = frames(call.text)
    assert got.count("heartbeat") >= 3
    assert got.index("heartbeat") < next(i for i, f in enumerate(got) if f != "heartbeat" and f != "[DONE]"
                                         and f["choices"][0]["delta"].get("content") == "late")
    assert got[-1] == "[DONE]"


async def test_a_stream_without_output_for_the_request_timeout_ends_with_a_timeout_frame(tmp_path):
    h = Harness(tmp_path, ["a", FOREVER], request_timeout_s=0.3, heartbeat_seconds=0.05)
    async with running(h.app):
        call = await h.chat(stream=True, stream_options={"include_usage": True}).done()
        await settled(lambda: h.engine.closed)
        assert h.active() == 0
    got = frames(call.text)
    errors = [f for f in got if isinstance(f, dict) and "error" in f]
    assert errors == [{"error": {"message": "No output for 0 seconds", "type": "timeout_error",
                                 "param": None, "code": "timeout"}}]
    assert got[-1] == "[DONE]" and not any(isinstance(f, dict) and f.get("usage") for f in got)
    assert h.counted(504) == 1


async def test_a_preempted_stream_says_so_and_sends_no_usage(tmp_path):
    h = Harness(tmp_path, ["a", "abort"])
    async with running(h.app):
        call = await h.chat(stream=True, stream_options={"include_usage": True}).done()
    got = frames(call.text)
    assert got[-2]["error"]["code"] == "preempted" and got[-1] == "[DONE]"
    assert h.counted(503) == 1


async def test_an_engine_failure_mid_stream_is_a_generic_error_frame(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="mlxd")
    h = Harness(tmp_path, ["a", RuntimeError("boom at /secret/path")])
    async with running(h.app):
        call = await h.chat(stream=True).done()
    assert "secret" not in call.text
    got = frames(call.text)
    assert got[-2] == {"error": {"message": "Internal error during generation", "type": "server_error",
                                 "param": None, "code": "internal_error"}}
    assert h.active() == 0 and h.counted(500) == 1
    # The log line with the traceback names the request, as its activity row and request line do.
    failed = [r for r in caplog.records if "stream on m failed" in r.getMessage()]
    assert failed and f"request_id={call.headers['x-request-id']}" in failed[0].getMessage()
    assert failed[0].exc_info is not None


async def test_an_engine_failure_in_a_whole_answer_is_logged_with_its_request_id(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="mlxd")
    h = Harness(tmp_path, ["a", RuntimeError("boom at /secret/path")])
    async with running(h.app):
        call = h.chat()
        # Starlette answers the 500, then raises on for the server's own log.
        with pytest.raises(RuntimeError):
            await call.done()
    assert call.status == 500 and "secret" not in call.text
    request_id = call.headers["x-request-id"]  # (it had none: the 500 left outside RequestIds)
    failed = [r for r in caplog.records if r.exc_info is not None and r.name.startswith("mlxd")]
    assert failed and f"request_id={request_id}" in failed[0].getMessage()
    # Counted and kept like any failure: it used to leave no metric, no row and no request line.
    assert h.counted(500) == 1
    assert h.daemon.ctx.activity.flush()
    (row,) = h.daemon.ctx.activity.query(request_id=request_id)
    assert row["status"] == 500 and row["error"] == "internal error"
    assert [r for r in caplog.records if r.name == "mlxd.requests" and f"request_id={request_id}" in r.getMessage()
            and "status=500" in r.getMessage()]


# --- racing: deadlines and disconnects ----------------------------------------


async def test_a_deadline_cancels_the_generation_and_gives_the_lease_back(tmp_path):
    h = Harness(tmp_path, ["a", FOREVER])
    async with running(h.app):
        call = await h.chat(timeout=0.2).done()
        assert call.status == 504
        assert call.json()["error"]["type"] == "timeout_error"
        assert h.engine.closed == [h.engine.requests[0].request_id]
        assert h.active() == 0 and h.counted(504) == 1


async def test_a_request_waiting_for_a_busy_model_times_out_without_holding_a_slot(tmp_path):
    h = Harness(tmp_path, [FOREVER])
    async with running(h.app):
        first = h.chat()
        await h.engine.started.wait()
        second = await h.chat(timeout=0.2).done()
        assert second.status == 504 and second.json()["error"]["code"] == "timeout"
        first.disconnect()
        await first.done()
        await settled(lambda: h.active() == 0)
        assert h.daemon.ctx.manager.view("m").queued == 0


async def test_a_client_gone_before_the_answer_stops_the_generation(tmp_path):
    h = Harness(tmp_path, ["a", FOREVER])
    async with running(h.app):
        call = h.chat()
        await h.engine.started.wait()
        call.disconnect()
        await call.done()
        assert call.status == 499
        assert h.engine.closed and h.active() == 0 and h.counted(499) == 1


async def test_a_client_gone_mid_stream_stops_the_generation(tmp_path):
    h = Harness(tmp_path, ["first", FOREVER], heartbeat_seconds=0.05)
    async with running(h.app):
        call = h.chat(stream=True)
        await call.text_until('"first"')
        call.disconnect()
        await call.done()
        await settled(lambda: h.engine.closed and h.active() == 0)
        assert h.counted(499) == 1


# --- error bodies ---------------------------------------------------------------


def _error(call: Call) -> dict[str, Any]:
    body = call.json()
    assert set(body) == {"error"} and set(body["error"]) >= {"message", "type", "param", "code"}
    return body["error"]


@pytest.mark.parametrize(
    ("body", "status", "param", "code"),
    [
        ({"model": "nope", "messages": CHAT}, 404, "model", "model_not_found"),
        ({"model": "m", "messages": CHAT, "top_logprobs": 2}, 400, "top_logprobs", "invalid_request"),
        # A body that does not validate: OpenAI's 400 naming the field by its dotted path, not FastAPI's 422.
        ({"model": "m", "messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role", "invalid_value"),
        ({"model": "m", "messages": []}, 400, "messages", "invalid_value"),
        ({"model": "m"}, 400, "messages", "missing_required_parameter"),
        ({"model": "m", "messages": CHAT, "max_tokens": "lots"}, 400, "max_tokens", "invalid_type"),
        # No member of a union fits: the field is named, not the member pydantic tried.
        ({"model": "m", "messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content", "invalid_type"),
        ({"model": "m", "messages": CHAT, "stop": 5}, 400, "stop", "invalid_type"),
        ({"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"function": {}}]}]}, 400,
         "messages[0].tool_calls[0].function.name", "missing_required_parameter"),
        ({"model": "m", "messages": CHAT, "max_tokens": 10**9}, 400, "max_tokens", "invalid_request"),
        ({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]}, 400, "messages", "invalid_request"),
        ({"model": "eyes", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://example.invalid/a.png"}}]}]},
         400, "messages[0].content[0]", "invalid_request"),
        ({"model": "m", "messages": [{"role": "user", "content": [{"type": "audio"}]}]}, 400,
         "messages[0].content", "invalid_request"),
    ],
)
async def test_bad_requests_get_openai_error_bodies(tmp_path, body, status, param, code):
    h = Harness(tmp_path, ["never", "stop"])
    async with running(h.app):
        call = await h.post("/v1/chat/completions", body).done()
    assert call.status == status
    error = _error(call)
    assert (error["param"], error["code"]) == (param, code)
    assert h.engine.requests == [], "a refused request never reaches the engine"


@pytest.mark.parametrize(
    ("path", "body", "param", "code"),
    [
        ("/v1/completions", {"model": "m", "prompt": "hi", "max_tokens": 0}, "max_tokens", "invalid_value"),
        ("/v1/completions", {"model": "m", "prompt": ["a", 5]}, "prompt[1]", "invalid_type"),
        ("/v1/responses", {"model": "m"}, "input", "missing_required_parameter"),
        ("/v1/responses", {"model": "m", "input": 5}, "input", "invalid_type"),
        ("/v1/responses", {"model": "m", "input": "hi", "temperature": 9}, "temperature", "invalid_value"),
    ],
)
async def test_every_openai_surface_answers_a_body_that_does_not_validate_with_a_400(tmp_path, path, body, param, code):
    h = Harness(tmp_path, ["never", "stop"])
    async with running(h.app):
        call = await h.post(path, body).done()
    assert call.status == 400
    error = _error(call)
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)
    assert error["message"].startswith(f"{param}: ")


async def test_a_body_that_is_not_json_is_named_as_such(tmp_path):
    h = Harness(tmp_path, ["stop"])
    async with running(h.app):
        call = await h.post("/v1/chat/completions", b"{not json").done()
    assert call.status == 400 and _error(call)["message"] == "The request body is not valid JSON"
    assert _error(call)["param"] is None
    assert _error(call)["code"] == "invalid_json"  # a code a client can branch on, not null


async def test_a_preempted_answer_is_a_503_with_retry_after(tmp_path):
    h = Harness(tmp_path, ["a", "abort"])
    async with running(h.app):
        call = await h.chat().done()
    assert call.status == 503 and call.headers["retry-after"] == "5"
    assert _error(call)["code"] == "preempted"


async def test_an_unknown_route_is_a_404_in_the_same_shape(tmp_path):
    h = Harness(tmp_path, ["stop"])
    async with running(h.app):
        call = await h.post("/v1/nope", {}).done()
    assert call.status == 404
    assert _error(call) == {"message": "No route for POST /v1/nope", "type": "invalid_request_error",
                            "param": None, "code": None}


def test_tool_call_deltas_collect_into_one_call_per_index():
    # The shape the tool-calling lane's engines will emit: a call named first,
    # its arguments in pieces, another call after it.
    from mlxd.api.events import Finish, ToolCallDelta, Usage
    from mlxd.api.generation import Answer

    answer = Answer(choices=[])
    for event in [ToolCallDelta(0, 0, id="call_1", name="weather"), ToolCallDelta(0, 0, arguments='{"city": '),
                  ToolCallDelta(0, 0, arguments='"Oslo"}'), ToolCallDelta(0, 1, id="call_2", name="time"),
                  Finish(0, "tool_calls", Usage(4, 9))]:
        answer.add(event)
    [choice] = answer.choices
    assert [(c.id, c.name, c.arguments) for c in choice.tool_calls] == [
        ("call_1", "weather", '{"city": "Oslo"}'), ("call_2", "time", "")]
    assert choice.finish_reason == "tool_calls" and answer.usage.total_tokens == 13


def test_whitespace_between_parallel_calls_is_no_text_but_text_after_a_call_keeps_it():
    from mlxd.api.events import ChoiceEvents, TextDelta, ToolCallDelta
    from mlxd.engine.types import GenerationChunk
    from mlxd.tools.formats import format_named

    def texts(pieces: list[str]) -> tuple[list[str], int]:
        events = ChoiceEvents(format_named("json_tools"))
        out = [e for i, p in enumerate(pieces) for e in events.of(0, GenerationChunk(
            text=p, finish_reason="stop" if i == len(pieces) - 1 else None, prompt_tokens=3, completion_tokens=i + 1))]
        return [e.text for e in out if isinstance(e, TextDelta)], len({e.index for e in out if isinstance(e, ToolCallDelta)})

    call = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    # The template's separator between calls reached clients as text: "\n" deltas, a content of "\n\n\n".
    assert texts([call, "\n", call, "\n", call, ""]) == ([], 3)
    assert texts(["Sure.", "\n", call, "\n", " Done", "."]) == (["Sure.", "\n", "\n Done", "."], 1)


def test_tool_call_deltas_stream_as_openai_tool_call_chunks():
    from mlxd.api.events import ToolCallDelta
    from mlxd.api.openai.answers import OpenAIFrames
    from mlxd.api.plan import Plan

    plan = Plan(kind="chat", spec=spec("m", 1), requested_name="m", requests=[], stream=True, timeout=1, id="chatcmpl-x")
    frames_ = OpenAIFrames(plan, chat=True, include_usage=False)
    first, more = (frames(frames_.event(e))[0]["choices"][0]["delta"] for e in [
        ToolCallDelta(0, 0, id="call_1", name="weather", arguments=""), ToolCallDelta(0, 0, arguments='{"c')])
    assert first == {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                     "function": {"name": "weather", "arguments": ""}}]}
    assert more == {"tool_calls": [{"index": 0, "function": {"arguments": '{"c'}}]}


@pytest.mark.parametrize("choice, stops", [
    ("auto", ["</s>", '"']),
    ("required", []),
    ({"type": "function", "function": {"name": "add"}}, []),
])
def test_stop_strings_apply_to_everything_but_a_forced_call(choice, stops):
    # Shared planning: the rule holds for every surface that maps onto OutputRequest.
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    plan = Plan(
        kind="messages", spec=spec("m", 1), requested_name="m", stream=False, timeout=FOREVER,
        requests=[GenerationRequest("r-0", 8, stop=["</s>", '"']), GenerationRequest("r-1", 8, stop=["</s>", '"'])],
        output=OutputRequest(tools=chat_tools(tools), tool_choice=chat_tool_choice(choice)),
    )
    attempt = for_target(plan, plan.spec, max_request_tokens=4096)
    shape_locally(attempt.requests, plan.output, plan.requested_name, format_named("json_tools"))
    assert [r.stop for r in attempt.requests] == [stops, stops]
    # The plan is not rewritten: the next target's attempt starts from the client's stop strings.
    assert [r.stop for r in plan.requests] == [["</s>", '"'], ["</s>", '"']]


@pytest.mark.parametrize("path, body, field", [
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": "3"}, "max_tokens"),
    ("/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": "3"}, "max_completion_tokens"),
    ("/v1/messages", {"messages": CHAT, "max_tokens": "3"}, "max_tokens"),
    ("/v1/responses", {"input": "Say hello", "max_output_tokens": "3"}, "max_output_tokens"),
])
async def test_a_token_limit_sent_as_a_string_is_refused_not_coerced(tmp_path, path, body, field):
    # OpenAI and Anthropic refuse "3" for an integer; coercing it hides a
    # client's bug (and "3" is not what a typed SDK would ever send).
    h = Harness(tmp_path, ["stop"])
    async with running(h.app):
        call = await h.post(path, {"model": "m", **body}).done()
    assert call.status == 400, call.json()
    body = call.json()
    message = body["error"]["message"]
    assert field in message and "integer" in message.lower(), message
    assert h.engine.requests == []


# A model that writes two calls by itself (under tool_choice "auto", where no
# grammar bounds how many): a random-weight model never does, so it is scripted.
TWO_CALLS = ['<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>', "\n",
             '<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call>', "stop"]
ADD_TOOL = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
ADD_ANTHROPIC = {"name": "add", "input_schema": {"type": "object"}}
ADD_RESPONSES = {"type": "function", "name": "add", "parameters": {"type": "object"}}


def _called(path: str, call: Call, stream: bool) -> list[str]:
    """The arguments of each call the answer made, in order."""
    if not stream:
        body = call.json()
        if path == "/v1/chat/completions":
            return [c["function"]["arguments"] for c in body["choices"][0]["message"].get("tool_calls") or ()]
        if path == "/v1/messages":
            return [json.dumps(b["input"]) for b in body["content"] if b["type"] == "tool_use"]
        return [item["arguments"] for item in body["output"] if item["type"] == "function_call"]
    args: dict[int, str] = {}
    for chunk in frames(call.text):
        if isinstance(chunk, dict) and chunk.get("choices"):
            for delta in chunk["choices"][0]["delta"].get("tool_calls") or ():
                args[delta["index"]] = args.get(delta["index"], "") + delta["function"].get("arguments", "")
    return [args[i] for i in sorted(args)]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"messages": CHAT, "tools": [ADD_TOOL], "parallel_tool_calls": False}),
    ("/v1/messages", {"max_tokens": 8, "messages": CHAT, "tools": [ADD_ANTHROPIC],
                      "tool_choice": {"type": "auto", "disable_parallel_tool_use": True}}),
    ("/v1/responses", {"input": "Say hello", "tools": [ADD_RESPONSES], "parallel_tool_calls": False}),
], ids=["chat", "messages", "responses"])
async def test_parallel_calls_turned_off_answer_one_call_even_when_the_model_writes_two(tmp_path, path, body, stream):
    h = Harness(tmp_path, TWO_CALLS)
    h.engine.tool_format = format_named("json_tools")
    async with running(h.app):
        call = await h.post(path, {"model": "m", **body, **({"stream": True} if stream else {})}).done()
    assert call.status == 200, call.text
    if not stream or path == "/v1/chat/completions":
        assert [json.loads(a) for a in _called(path, call, stream)] == [{"a": 1}]
    else:  # the other surfaces' streams: one call opened, the first one
        opened = '"content_block":{"type":"tool_use"' if path == "/v1/messages" else '"response.output_item.added"'
        assert call.text.count(opened) == 1
        assert '{\\"a\\": 1}' in call.text and '{\\"a\\": 2}' not in call.text
    # Left on (the default), both calls come.
    body = {k: v for k, v in body.items() if k != "parallel_tool_calls"}
    if path == "/v1/messages":
        body["tool_choice"] = {"type": "auto"}
    h = Harness(tmp_path, TWO_CALLS)
    h.engine.tool_format = format_named("json_tools")
    async with running(h.app):
        call = await h.post(path, {"model": "m", **body}).done()
    assert [json.loads(a) for a in _called(path, call, False)] == [{"a": 1}, {"a": 2}]
