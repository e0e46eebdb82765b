"""Helpers for the monitoring tests: a broken model folder, requests, and a
parsed /metrics scrape."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from support.daemon import tiny_model

CHAT = [{"role": "user", "content": "Read the configuration file and report the errors"}]


def corrupt_model(directory: Path) -> Path:
    """A copy of the tiny qwen whose model.safetensors names a tensor the
    model does not have. Its header stays valid and its sizes right, so the
    registry accepts it (and sizes it); only mlx_lm.load fails."""
    broken = directory / "broken-model"
    shutil.copytree(tiny_model("qwen"), broken)
    weights = broken / "model.safetensors"
    data = bytearray(weights.read_bytes())
    header_length = struct.unpack("<Q", data[:8])[0]
    at = bytes(data[8 : 8 + header_length]).index(b"embed_tokens")
    data[8 + at : 8 + at + len(b"embed_tokens")] = b"embed_tokenZ"
    weights.write_bytes(bytes(data))
    return broken


def chat(daemon: Any, model: str, max_tokens: int = 8, headers: dict[str, str] | None = None, **kw: Any) -> httpx.Response:
    return httpx.post(
        f"{daemon.url}/v1/chat/completions",
        json={"model": model, "messages": CHAT, "max_tokens": max_tokens, **kw},
        headers=headers,
        timeout=60,
    )


def scrape(daemon: Any, headers: dict[str, str] | None = None) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of /metrics, keyed by (sample name, labels)."""
    response = httpx.get(f"{daemon.url}/metrics", headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def sample(samples: dict, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))
