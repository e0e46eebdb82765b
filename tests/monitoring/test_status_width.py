"""`mlxd status` reads at a glance in an 80-column terminal, as `ollama ps`
does: one line per model, no cell wrapped or cut, for the names people use."""

from __future__ import annotations

import copy
import io
import os
import subprocess
import sys

import httpx
import pytest
from monitoring.monitoring_support import chat, corrupt_model
from rich.console import Console
from support.daemon import daemon_in_thread, write_registry

from mlxd.cli.status import render

pytestmark = pytest.mark.mlx

NAMES = {
    "qwen2.5-coder-7b": ("qwen", ["coder"]),
    "llama-3.2-3b-instruct": ("llama", []),
    "smollm2-360m": ("qwen-b", ["small"]),
}
COLUMNS = ("NAME", "STATE", "MEMORY", "LEASES", "UNLOADS", "TOK/S", "LOADS")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("width")
    models = [{"name": n, "model": m, "aliases": a, "idle_unload_seconds": 7200} for n, (m, a) in NAMES.items()]
    models.append({"name": "mistral-7b-broken", "path": str(corrupt_model(tmp))})
    registry = write_registry(tmp, models)
    with daemon_in_thread(registry, tmp) as d:
        assert chat(d, "qwen2.5-coder-7b").status_code == 200
        assert chat(d, "mistral-7b-broken").status_code == 503  # its load fails: state failed
        yield d


def rows(text: str) -> dict[str, str]:
    """Model name -> its line in the table."""
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["NAME", "STATE"])
    assert lines[header].split() == list(COLUMNS), lines[header]
    found = {}
    for line in lines[header + 1 :]:
        if not line.strip():
            break
        found[line.split()[0]] = line
    return found


def test_mlxd_status_in_an_80_column_terminal_is_one_line_per_model(daemon):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLXD_")}
    result = subprocess.run(
        [sys.executable, "-m", "mlxd", "status", "--url", daemon.url],
        capture_output=True, text=True, timeout=60, env={**env, "COLUMNS": "80"},
    )
    assert result.returncode == 0, result.stderr
    assert max(len(line) for line in result.stdout.splitlines()) <= 80
    table = rows(result.stdout)
    assert set(table) == {*NAMES, "mistral-7b-broken"}, result.stdout
    coder = table["qwen2.5-coder-7b"].split()
    assert coder[:3] == ["qwen2.5-coder-7b", "(coder)", "loaded"] and coder[4] == "MB" and coder[5] == "0/1"
    assert coder[6] == "in" and coder[7] in ("2h00m", "1h59m"), coder
    assert table["llama-3.2-3b-instruct"].split()[1] == "unloaded"
    assert table["mistral-7b-broken"].split()[1] == "failed"
    assert "…" not in "".join(table.values())
    # The reason is there in full, among the health problems, not squeezed into a cell.
    assert "• model `mistral-7b-broken` failed to load" in result.stdout


def test_every_state_and_the_widest_cells_fit_80_columns(daemon):
    doc = httpx.get(f"{daemon.url}/v1/status", timeout=10).json()
    busy = copy.deepcopy(doc)
    widest = {
        "qwen2.5-coder-7b": {"state": "unloading", "idle_unload_in_seconds": 3 * 3600 + 59 * 60, "failures": 3},
        "llama-3.2-3b-instruct": {"state": "draining", "active_leases": 8, "max_concurrency": 8, "queued": 64},
        "smollm2-360m": {"state": "loading", "memory": {**doc["models"][2]["memory"], "reserved_bytes": 1023 * 1024**2}},
        # Served, its warm-up still running in the background.
        "mistral-7b-broken": {"state": "loaded", "warmup_done": False, "warmup_mode": "background"},
    }
    for model in busy["models"]:
        model.update(widest.get(model["name"], {}))
        model["recent_tokens_per_second"] = 1234.5
        model["load_count"] = 120
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(render(busy, 80))
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80
    table = rows(text)
    assert table["qwen2.5-coder-7b"].split()[2:3] == ["unloading"]
    assert "3h59m" in table["qwen2.5-coder-7b"] and "120 ✗3" in table["qwen2.5-coder-7b"]
    assert "8/8 +64" in table["llama-3.2-3b-instruct"]
    assert "1023 MB" in table["smollm2-360m"] and "1234" in table["smollm2-360m"]
    assert table["mistral-7b-broken"].split()[1] == "warming"
    assert "…" not in "".join(table.values())


def test_where_80_columns_are_too_few_the_names_are_cut_not_the_figures(daemon):
    # An entry with many aliases (the demo's smollm2-135m answers to
    # `default`, `claude-*` and `gpt-*`) and an app with a long name: the
    # state, memory and counts stay whole, and the name keeps its start.
    doc = httpx.get(f"{daemon.url}/v1/status", timeout=10).json()
    for model in doc["models"]:
        if model["name"] == "llama-3.2-3b-instruct":
            model["aliases"] = ["default", "claude-*", "gpt-*", "llama-3.2-3b-instruct-q4"]
            model["state"], model["load_count"] = "unloading", 12345
    doc["usage"] = [{"app": "retrieval-indexer-for-the-whole-team-wiki", "model": "llama-3.2-3b-instruct-q4_k_m",
                     "requests": 123456, "errors": 789, "tokens_in": 123456789012, "tokens_cached": 1234567,
                     "tokens_out": 98765432}]
    out = io.StringIO()
    Console(file=out, width=80, color_system=None).print(render(doc, 80))
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80
    line = rows(text)["llama-3.2-3b-instruct"]
    assert "unloading" in line.split(), line
    assert line.rstrip().endswith("12345") and "…" in line
    usage = next(line for line in text.splitlines() if line.startswith("retrieval-"))
    assert usage.split()[-5:] == ["123456", "789", "123456789012", "1234567", "98765432"], usage
    assert "llama-3.2" in usage
