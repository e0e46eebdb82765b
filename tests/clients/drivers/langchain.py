"""langchain-openai and langchain-anthropic against mlxd, as their docs point
them at a compatible server: ChatOpenAI(base_url=.../v1), ChatAnthropic(base_url=...)."""

import json
import os
from typing import Literal

from langchain_anthropic import ChatAnthropic
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

URL = os.environ["MLXD_URL"]


class Status(BaseModel):
    ok: bool
    level: Literal["low", "high"]


@tool
def get_weather(city: Literal["Paris", "Oslo"], days: int = Field(ge=1, le=7)) -> str:
    """The forecast for a city."""
    return f"{city}: sun for {days} days"


out = {}
chat = ChatOpenAI(base_url=URL + "/v1", api_key="unused", model="default", max_tokens=60)
out["openai_plain"] = chat.invoke("Say hello").content
out["openai_stream"] = "".join(c.content for c in chat.stream("Say hello"))
# Token usage, asked for (stream_usage) and added up over the chunks, as LangChain does.
counting = ChatOpenAI(base_url=URL + "/v1", api_key="unused", model="qwen-tiny", max_tokens=5, temperature=0,
                      stream_usage=True)
whole = None
for piece in counting.stream("Say hello"):
    whole = piece if whole is None else whole + piece
invoked = counting.invoke("Say hello").usage_metadata
out["usage_streamed"] = [whole.usage_metadata["input_tokens"], whole.usage_metadata["output_tokens"]]
out["usage_invoked"] = [invoked["input_tokens"], invoked["output_tokens"]]
tiny = ChatOpenAI(base_url=URL + "/v1", api_key="unused", model="qwen-tiny", max_tokens=120)
call = tiny.bind_tools([get_weather], tool_choice="get_weather").invoke("Weather in Oslo?").tool_calls[0]
out["openai_tool"] = {"name": call["name"], "args": call["args"]}
out["openai_typed"] = tiny.with_structured_output(Status, method="json_schema").invoke("Report the status").model_dump()
claude = ChatAnthropic(base_url=URL, api_key="unused", model="default", max_tokens=60)
out["anthropic_plain"] = claude.invoke("Say hello").content
tiny_claude = ChatAnthropic(base_url=URL, api_key="unused", model="qwen-tiny", max_tokens=120)
call = tiny_claude.bind_tools([get_weather], tool_choice="get_weather").invoke("Weather in Oslo?").tool_calls[0]
out["anthropic_tool"] = {"name": call["name"], "args": call["args"]}
print(json.dumps(out))
