"""docs/apps.md shows what mlxd does: its worked example loads, each app's
scope is what the page's table says, its hash command makes the hash the
example holds, and the headers it lists are the ones a 429 carries."""

from __future__ import annotations

import json
import re
import struct
import subprocess
from pathlib import Path

from mlxd.api.limits import LimitBook, Limits
from mlxd.registry.loader import load_registry_text

PAGE = Path(__file__).resolve().parents[2] / "docs" / "apps.md"
GIB = 1024**3


def _block(kind: str) -> str:
    return re.findall(rf"```{kind}\n(.*?)```", PAGE.read_text(), flags=re.S)[0]


def _table(title: str) -> list[list[str]]:
    """The rows (under the header and its rule) of the table whose header starts with ``title``."""
    lines = PAGE.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip().strip("`") for cell in line.strip("|").split("|")])
    return rows


def test_the_worked_example_loads_with_the_scopes_the_page_lists(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    header = json.dumps({"__metadata__": {}}).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "rag-indexer.key").write_text("sk-rag\n")
    text = re.sub(r"path: .*", f"path: {folder}", _block("yaml")).replace("    kind: embedding\n", "")
    registry = load_registry_text(text, tmp_path / "models.yaml", physical_memory=16 * GIB,
                                  env={"MLXD_EDITOR_KEY": "sk-editor", "MLXD_ADMIN_KEY": "sk-admin"})
    apps = {a.name: a for a in registry.apps or ()}
    table = {row[0]: row for row in _table("| App | Models |")}
    assert set(table) == set(apps) == {"editor", "rag-indexer", "chat", "ops"}
    for name, (_, models, routes, admin, priority, _limits) in table.items():
        app = apps[name]
        assert ", ".join(app.models) == models and ", ".join(app.routes) == routes, name
        assert ("yes" if app.admin else "no") == admin and app.priority == priority, name
    # The hash command as the page shows it.
    command = _block("sh").strip()
    made = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True).stdout.split()[0]
    assert apps["chat"].key_sha256 == made


def test_the_rate_limit_headers_the_page_lists_are_the_ones_sent():
    book = LimitBook()
    limits = Limits(max_concurrency=1, rpm=1, tpm=10, tokens_per_day=10)
    sent = set(book.admit("a", limits, 0.0).headers())
    listed = {h.strip().strip("`") for row in _table("| Header | For |") for h in row[0].split(",")}
    assert sent == listed
