"""`mlxd reload` against a daemon: what an operator sees for success, a
wrong key and no daemon at all (the invalid-file case is run as a real
process by test_reload_docs)."""

from __future__ import annotations

import pytest
from reload.harness import registry_doc, reloading_daemon, replace_atomically
from support.daemon import free_port
from typer.testing import CliRunner

from mlxd.cli.main import app

A = {"name": "a", "model": "qwen"}


def mlxd(*args: str):
    return CliRunner().invoke(app, list(args))


@pytest.mark.mlx
def test_reload_prints_one_line_and_refuses_a_wrong_key(tmp_path):
    registry = tmp_path / "models.yaml"
    registry.write_text(registry_doc(tmp_path, [A], server={"api_keys": ["right"]}))
    with reloading_daemon(registry, tmp_path, watch=False) as d:
        replace_atomically(
            registry, registry_doc(tmp_path, [A, {"name": "c", "model": "llama"}], server={"api_keys": ["right"]})
        )
        refused = mlxd("reload", "--url", d.url, "--api-key", "wrong")
        assert refused.exit_code == 1 and "401" in refused.stderr and refused.stdout == ""
        assert d.ctx.config.generation == 1
        done = mlxd("reload", "--url", d.url, "--api-key", "right")
        assert done.exit_code == 0, done.stderr
        assert done.stdout == "generation 2 applied: added: c\n"
        again = mlxd("reload", "--url", d.url, "--api-key", "right")
        assert again.stdout == "generation 2 unchanged\n"


def test_reload_without_a_daemon_says_so_in_one_line():
    result = mlxd("reload", "--url", f"http://127.0.0.1:{free_port()}")
    assert result.exit_code == 1
    assert result.stderr.startswith("mlxd: error: no mlxd is running at") and len(result.stderr.splitlines()) == 1
