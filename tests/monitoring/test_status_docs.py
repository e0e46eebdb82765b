"""docs/status.md stays true: every key the daemon emits is documented, every
documented key is emitted, and values have the type and unit the docs give."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from monitoring.monitoring_support import chat, corrupt_model
from reload.harness import reloading_daemon
from support.daemon import free_port, wait_until, write_registry

from mlxd.monitoring.status import SCHEMA_VERSION

DOC = Path(__file__).resolve().parents[2] / "docs" / "status.md"
# Objects whose keys belong to another component; documented as opaque.
OPAQUE = {"models[].engine", "config.last_reload.models", "backends[].models"}


def documented(section: str) -> dict[str, str]:
    """`path` -> its table row, for the rows of one `## ` section of the doc."""
    text = DOC.read_text()
    start = text.index(f"## {section}")
    end = text.find("\n## ", start + 1)
    rows = {}
    for line in text[start : end if end != -1 else None].splitlines():
        match = re.match(r"\| `([^`]+)` \|", line)
        if match:
            rows[match.group(1)] = line
    return rows


def key_paths(value: Any, prefix: str = "") -> set[str]:
    paths: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{prefix}.{key}" if prefix else key
            paths.add(path)
            if path not in OPAQUE:
                paths |= key_paths(item, path)
    elif isinstance(value, list):
        for item in value:
            paths |= key_paths(item, f"{prefix}[]")
    return paths


def leaves(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(value, dict):
        out = []
        for key, item in value.items():
            path = f"{prefix}.{key}" if prefix else key
            if path not in OPAQUE:
                out += leaves(item, path)
        return out
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return [leaf for item in value for leaf in leaves(item, f"{prefix}[]")]
    return [(prefix, value)]


@pytest.fixture(scope="module")
def rich_status(tmp_path_factory) -> tuple[dict[str, Any], dict[str, Any], str]:
    """A status document in which every optional part is filled in: a loaded
    model, a failed one, a remote one on a backend that is down, events,
    and a reload rejected because the file on disk became invalid."""
    tmp = tmp_path_factory.mktemp("docs")
    registry = write_registry(
        tmp, [{"name": "qwen", "model": "qwen", "aliases": ["q"], "speculative": {"method": "prompt_lookup"}}, {"name": "broken", "path": str(corrupt_model(tmp))},
              {"name": "far", "backend": "off"},
              {"name": "either", "targets": ["off:elsewhere", "qwen"], "strategy": "spillover"},
              {"name": "brief", "model": "llama"}]  # loaded, then unloaded: its last_unload
    )
    doc = yaml.safe_load(registry.read_text())
    # Keyless loopback requests are an app with a limit (apps[]), one that reads everything.
    doc["apps"] = [{"name": "local", "key": "none", "admin": True, "rpm": 1000}]
    doc["backends"] = {"off": {"url": f"http://127.0.0.1:{free_port()}/v1", "poll_interval_s": 1}}
    registry.write_text(yaml.safe_dump(doc, sort_keys=False))
    with reloading_daemon(registry, tmp, watch=False) as d:
        assert chat(d, "qwen").status_code == 200
        assert chat(d, "broken").status_code == 503
        assert chat(d, "far").status_code == 503
        assert chat(d, "either").status_code == 200
        assert chat(d, "brief").status_code == 200
        assert httpx.post(f"{d.url}/v1/models/brief/unload", json={}).status_code == 200
        wait_until(lambda: next(m for m in d.status()["models"] if m["name"] == "brief")["last_unload"])
        wait_until(lambda: d.status()["backends"][0]["polled_at"])
        registry.write_text(registry.read_text() + "surprise: 1\n")
        assert d.reload().status_code == 400
        yield d.status(), httpx.get(f"{d.url}/health").json(), httpx.get(f"{d.url}/metrics").text


@pytest.mark.mlx
def test_every_emitted_status_key_is_documented_and_every_documented_key_is_emitted(rich_status):
    status, _, _ = rich_status
    emitted = key_paths(status)
    docs = documented("`GET /v1/status`")
    assert sorted(emitted - set(docs)) == [], "emitted but not in docs/status.md"
    assert sorted(set(docs) - emitted) == [], "documented but never emitted"
    for path in OPAQUE:
        assert "opaque" in docs[path]


@pytest.mark.mlx
def test_every_health_key_is_documented(rich_status):
    _, health, _ = rich_status
    docs = documented("`GET /health`")
    assert key_paths(health) == set(docs)


@pytest.mark.mlx
def test_values_have_the_documented_units_and_types(rich_status):
    status, _, _ = rich_status
    for path, value in leaves(status):
        name = path.rsplit(".", 1)[-1]
        if value is None:
            assert "null" in documented("`GET /v1/status`")[path], f"{path} is null but not documented as nullable"
        elif name.endswith("_bytes"):
            assert isinstance(value, int) and value >= 0, path
        elif name.endswith("_at") or name == "at":
            assert isinstance(value, float) and value > 1_577_836_800, f"{path} is not epoch seconds"
        elif name.endswith("_seconds"):
            assert isinstance(value, (int, float)) and value >= 0, path
        row = documented("`GET /v1/status`")[path]
        if name.endswith("_bytes"):
            assert "bytes" in row, path
        if name.endswith("_at") or name == "at":
            assert "epoch s" in row, path


def test_the_documented_schema_version_is_the_emitted_one():
    assert f"schema version {SCHEMA_VERSION}" in DOC.read_text()


@pytest.mark.mlx
def test_every_metric_family_is_documented(rich_status):
    _, _, scraped = rich_status
    text = DOC.read_text()
    section = text[text.index("## `GET /metrics`") : text.index("## `mlxd status`")]
    families = list(text_string_to_metric_families(scraped))
    assert len(families) >= 20
    for family in families:
        # The parser names counters without the _total suffix they are exposed with.
        name = f"{family.name}_total" if family.type == "counter" else family.name
        if family.name.endswith("_created"):
            continue  # prometheus_client's creation timestamps, one per counter and histogram
        assert f"`{name}`" in section, f"{name} is not documented"
