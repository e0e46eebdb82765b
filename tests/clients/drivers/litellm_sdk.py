"""litellm against mlxd as its docs reach an OpenAI-compatible server: the
`openai/` model prefix with api_base; a streamed answer, a forced tool call
and a pydantic response_format."""

import json
import os
from typing import Literal

import litellm
from pydantic import BaseModel

BASE = {"api_base": os.environ["MLXD_URL"] + "/v1", "api_key": "unused"}
HELLO = [{"role": "user", "content": "Say hello"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The forecast for a city.",
    "parameters": {"type": "object", "required": ["city", "days"], "properties": {
        "city": {"enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7}}}}}


class Status(BaseModel):
    ok: bool
    level: Literal["low", "high"]


out = {"plain": litellm.completion(model="openai/default", messages=HELLO, max_tokens=40, **BASE)
       .choices[0].message.content}
stream = litellm.completion(model="openai/default", messages=HELLO, max_tokens=40, stream=True, **BASE)
out["streamed"] = "".join(chunk.choices[0].delta.content or "" for chunk in stream)
call = litellm.completion(
    model="openai/qwen-tiny", messages=[{"role": "user", "content": "Weather in Oslo?"}], max_tokens=120,
    tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}}, **BASE,
).choices[0].message.tool_calls[0]
out["tool"] = {"name": call.function.name, "args": json.loads(call.function.arguments)}
typed = litellm.completion(model="openai/qwen-tiny", messages=[{"role": "user", "content": "Report the status"}],
                           max_tokens=80, response_format=Status, **BASE)
out["typed"] = Status.model_validate_json(typed.choices[0].message.content).model_dump()
print(json.dumps(out))
