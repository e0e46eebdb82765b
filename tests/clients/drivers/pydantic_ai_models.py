"""pydantic-ai with an OpenAI-compatible provider, as its docs set one up:
OpenAIProvider(base_url=...), the chat model and the Responses model."""

import json
import os
from typing import Literal

from pydantic import BaseModel
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider

provider = OpenAIProvider(base_url=os.environ["MLXD_URL"] + "/v1", api_key="unused")


class Status(BaseModel):
    ok: bool
    level: Literal["low", "high"]


out = {}
for kind, model_class in (("chat", OpenAIChatModel), ("responses", OpenAIResponsesModel)):
    plain = Agent(model_class("default", provider=provider), instructions="Be brief.")
    out[f"{kind}_plain"] = plain.run_sync("Say hello", model_settings={"max_tokens": 60}).output
    typed = Agent(model_class("qwen-tiny", provider=provider), output_type=Status)
    out[f"{kind}_typed"] = typed.run_sync("Report the status", model_settings={"max_tokens": 80}).output.model_dump()
print(json.dumps(out))
