"""`kv_bits` on the families whose caches are not all full attention: a
sliding-window layer (Gemma 3, gpt-oss) cannot be quantised by mlx-lm
("RotatingKVCache Quantization NYI", which failed every request of such a
model with a 500), and linear attention keeps a state, not keys. mlxd
quantises the full-attention layers and keeps the others as they are. An
attention that cannot read a quantised cache at all (gpt-oss's sinks) fails
the load, saying why, rather than every request."""

from __future__ import annotations

import dataclasses

import httpx
import pytest
from support.daemon import daemon_in_thread, write_registry
from zoo.zoo_support import CHAT

from mlxd.factory.zoo import FAMILIES
from mlxd.factory.zoo_build import build_row

pytestmark = pytest.mark.mlx

# Head size 64: the quantised cache's group size (the zoo rows' 16 is too small for any model).
WIDE_HEADS = {"head_dim": 64}
FAMILIES_WITH_OTHER_CACHES = ("gemma3_text", "qwen3_next")


def wide(name: str):
    row = FAMILIES[name]
    extra = {**WIDE_HEADS, **({"query_pre_attn_scalar": 64} if "query_pre_attn_scalar" in row.config else {})}
    return build_row(dataclasses.replace(row, name=f"{name}-h64", config={**row.config, **extra}))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kv-bits")
    entries = [{"name": name, "path": str(wide(name)), "kv_bits": 8, "max_concurrency": 1}
               for name in (*FAMILIES_WITH_OTHER_CACHES, "gpt_oss")]
    with daemon_in_thread(write_registry(tmp, entries), tmp) as d:
        yield d


@pytest.mark.parametrize("name", FAMILIES_WITH_OTHER_CACHES)
def test_a_quantised_kv_cache_serves_and_its_prefix_cache_hits(daemon, name):
    body = {"model": name, "messages": CHAT, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    first = httpx.post(f"{daemon.url}/v1/chat/completions", json=body, timeout=120)
    assert first.status_code == 200, first.text
    assert first.json()["usage"]["completion_tokens"] == 8
    again = httpx.post(f"{daemon.url}/v1/chat/completions", json=body, timeout=120).json()
    assert again["choices"][0]["message"] == first.json()["choices"][0]["message"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_an_attention_that_cannot_read_a_quantised_cache_fails_the_load_saying_why(daemon):
    body = {"model": "gpt_oss", "messages": CHAT, "max_tokens": 4}
    refused = httpx.post(f"{daemon.url}/v1/chat/completions", json=body, timeout=120)
    assert refused.status_code == 503, refused.text
    message = refused.json()["error"]["message"]
    assert "cannot use a quantised KV cache (`kv_bits: 8`)" in message and "attention sinks" in message
    assert "Remove `kv_bits`" in message
    health = httpx.get(f"{daemon.url}/v1/status", timeout=10).json()["health"]
    assert any("`gpt_oss` failed to load" in p and "kv_bits" in p for p in health["problems"])
