"""instructor over the OpenAI client, as its docs patch a compatible
endpoint: instructor.from_openai(OpenAI(base_url=...), mode=...)."""

import json
import os
from typing import Literal

import instructor
from openai import OpenAI
from pydantic import BaseModel


class Status(BaseModel):
    ok: bool
    level: Literal["low", "high"]


out = {}
# TOOLS forces a call (schema-valid on any model); JSON_SCHEMA sends a
# non-strict schema, which allows keys it does not name: a trained model ends
# the object, a random one writes keys to max_tokens, so it asks `default`.
for mode, model in (("TOOLS", "qwen-tiny"), ("JSON_SCHEMA", "default")):
    client = instructor.from_openai(OpenAI(base_url=os.environ["MLXD_URL"] + "/v1", api_key="unused"),
                                    mode=getattr(instructor.Mode, mode))
    status = client.chat.completions.create(model=model, response_model=Status, max_tokens=80, max_retries=0,
                                            messages=[{"role": "user", "content": "Report the status"}])
    out[mode] = status.model_dump()
plain = OpenAI(base_url=os.environ["MLXD_URL"] + "/v1", api_key="unused").chat.completions.create(
    model="default", max_tokens=40, messages=[{"role": "user", "content": "Say hello"}])
out["plain"] = plain.choices[0].message.content
print(json.dumps(out))
