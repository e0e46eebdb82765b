"""The OpenAI Agents SDK against mlxd, as its docs set up a custom OpenAI
endpoint: set_default_openai_client(AsyncOpenAI(base_url=...)), tracing off."""

import asyncio
import json
import os
from typing import Annotated, Literal

from agents import (Agent, ModelSettings, Runner, function_tool, set_default_openai_client, set_tracing_disabled,
                    tool_namespace)
from agents.exceptions import ModelBehaviorError
from openai import AsyncOpenAI
from pydantic import BaseModel, Field

set_tracing_disabled(True)
set_default_openai_client(AsyncOpenAI(base_url=os.environ["MLXD_URL"] + "/v1", api_key="unused"))


class Status(BaseModel):
    ok: bool
    level: Literal["low", "high"]


@function_tool
def get_weather(city: Literal["Paris", "Oslo"], days: Annotated[int, Field(ge=1, le=7)]) -> str:
    """The forecast for a city."""
    return json.dumps({"city": city, "days": days})


async def cut(stream: bool) -> dict:
    # Greedy: sampled at the default temperature, the random model draws an
    # end token within 8 tokens now and then, and a whole answer is not cut.
    agent = Agent(name="cut", model="qwen-tiny", model_settings=ModelSettings(max_tokens=8, temperature=0.0))
    try:
        if stream:
            run = Runner.run_streamed(agent, "Say hello")
            async for _ in run.stream_events():
                pass
            return {"returned": run.final_output}
        return {"returned": (await Runner.run(agent, "Say hello")).final_output}
    except ModelBehaviorError as exc:
        return {"raised": str(exc)}


async def main() -> None:
    out = {}
    plain = Agent(name="plain", instructions="Be brief.", model="default")
    out["plain"] = (await Runner.run(plain, "Say hello")).final_output
    streamed = Runner.run_streamed(plain, "Say hello")
    async for _ in streamed.stream_events():
        pass
    out["streamed"] = streamed.final_output
    out["cut_stream"], out["cut_whole"] = await cut(True), await cut(False)
    tooled = Agent(name="tools", model="qwen-tiny", tools=[get_weather], tool_use_behavior="stop_on_first_tool",
                   model_settings=ModelSettings(tool_choice="required", max_tokens=120))
    out["tool"] = json.loads((await Runner.run(tooled, "Weather in Oslo?")).final_output)
    # The same tool in a namespace (sent as a Responses namespace tool): the call comes back by namespace and name.
    spaced = Agent(name="spaced", model="qwen-tiny", tool_use_behavior="stop_on_first_tool",
                   tools=tool_namespace(name="weather", description="Weather tools.", tools=[get_weather]),
                   model_settings=ModelSettings(tool_choice="required", max_tokens=120))
    out["namespaced"] = json.loads((await Runner.run(spaced, "Weather in Paris?")).final_output)
    typed = Agent(name="typed", model="qwen-tiny", output_type=Status, model_settings=ModelSettings(max_tokens=60))
    out["typed"] = (await Runner.run(typed, "Report the status")).final_output.model_dump()
    print(json.dumps(out))


asyncio.run(main())
