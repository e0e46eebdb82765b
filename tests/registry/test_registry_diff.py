"""Hot reload's classification of what changed between two registries."""

from __future__ import annotations

import textwrap
from dataclasses import replace
from pathlib import Path

from mlxd.registry.diff import diff_registries
from mlxd.registry.loader import load_registry
from mlxd.registry.model import (
    ContentionSpec,
    ManagerSpec,
    ModelSpec,
    PrefixCacheSpec,
    Registry,
    SamplingDefaults,
    ServerSpec,
)


def spec(name: str, path: str = "", **kw) -> ModelSpec:
    return ModelSpec(
        name=name, path=Path(path or f"/models/{name}"), source=path or f"/models/{name}", **kw
    )


def registry(
    *models: ModelSpec, manager: ManagerSpec | None = None, server: ServerSpec | None = None
) -> Registry:
    return Registry(
        source_path=None,
        file_hash="x",
        manager=manager or ManagerSpec(memory_budget_bytes=1 << 30),
        server=server or ServerSpec(),
        models=models,
    )


def kinds(diff) -> dict[str, str]:
    return {c.name: c.kind for c in diff.changes}


def test_identical_registries_are_unchanged():
    old = registry(spec("a"), spec("b"))
    diff = diff_registries(old, registry(spec("a"), spec("b")))
    assert kinds(diff) == {"a": "unchanged", "b": "unchanged"}
    assert diff.is_empty
    assert diff.summary() == "no changes"


def test_added_and_removed():
    diff = diff_registries(registry(spec("a"), spec("b")), registry(spec("a"), spec("c")))
    assert diff.added == ("c",)
    assert diff.removed == ("b",)
    assert diff.unchanged == ("a",)
    assert not diff.is_empty


def test_fields_that_change_memory_need_a_reload():
    old = registry(spec("a"), spec("b"), spec("c"), spec("d"))
    new = registry(
        spec("a", max_context=8192),
        spec("b", path="/elsewhere/b"),
        spec("c", kv_bits=4),
        spec("d", prefix_cache=PrefixCacheSpec(max_bytes=1, disk_max_bytes=1)),
    )
    diff = diff_registries(old, new)
    assert diff.reload == ("a", "b", "c", "d")
    assert dict((c.name, c.fields) for c in diff.changes)["a"] == ("max_context",)
    assert dict((c.name, c.fields) for c in diff.changes)["b"] == ("path", "source")


def test_other_fields_apply_live():
    old = registry(spec("a"), spec("b"), spec("c"))
    new = registry(
        spec("a", aliases=("fast",), description="new words"),
        spec("b", defaults=SamplingDefaults(temperature=0.1), idle_unload_seconds=30),
        spec("c", max_queue=3, preload=True, pinned=True),
    )
    diff = diff_registries(old, new)
    assert diff.live == ("a", "b", "c")
    fields = {c.name: c.fields for c in diff.changes}
    assert fields["a"] == ("aliases", "description")
    assert fields["b"] == ("idle_unload_seconds", "defaults")
    assert set(fields["c"]) == {"max_queue", "preload", "pinned"}


def test_a_renamed_model_keeps_its_engine():
    old = registry(spec("qwen", path="/m/qwen", max_context=8192), spec("other"))
    new = registry(
        spec("qwen-chat", path="/m/qwen", max_context=8192, aliases=("qwen",)), spec("other")
    )
    diff = diff_registries(old, new)
    assert diff.renamed == (("qwen", "qwen-chat"),)
    assert diff.added == () and diff.removed == ()
    change = next(c for c in diff.changes if c.kind == "renamed")
    assert change.old_name == "qwen" and change.name == "qwen-chat"
    assert change.fields == ("name", "aliases")
    assert "renamed: qwen->qwen-chat" in diff.summary()


def test_a_rename_with_a_reload_change_is_a_remove_and_an_add():
    old = registry(spec("qwen", path="/m/qwen"))
    new = registry(spec("qwen-long", path="/m/qwen", max_context=32768))
    diff = diff_registries(old, new)
    assert diff.renamed == ()
    assert diff.added == ("qwen-long",) and diff.removed == ("qwen",)


def test_rename_matching_is_one_to_one():
    # Two old entries share a folder; two new names take one each, no more.
    old = registry(spec("a", path="/m/x"), spec("b", path="/m/x"))
    new = registry(spec("c", path="/m/x"), spec("d", path="/m/x"), spec("e", path="/m/x"))
    diff = diff_registries(old, new)
    assert diff.renamed == (("a", "c"), ("b", "d"))
    assert diff.added == ("e",)


def test_manager_and_server_changes_are_reported():
    old = registry(spec("a"))
    new = registry(
        spec("a"),
        manager=ManagerSpec(
            memory_budget_bytes=2 << 30, contention=ContentionSpec(strategy="fail")
        ),
        server=replace(ServerSpec(), api_keys=("k",)),
    )
    diff = diff_registries(old, new)
    assert diff.manager_fields == ("memory_budget_bytes", "contention")
    assert diff.server_fields == ("api_keys",)
    assert not diff.server_needs_restart
    assert diff.unchanged == ("a",)
    moved = diff_registries(old, registry(spec("a"), server=ServerSpec(port=9999)))
    assert moved.server_needs_restart


def test_diff_of_two_loaded_files(tmp_path, make_model):
    """Reloading an edited file: only what the edit touched changes."""
    for name in ("x", "y", "z"):
        make_model(tmp_path / name)
    path = tmp_path / "models.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            manager:
              memory_budget: 1GB
            models:
              - name: keep
                path: x
              - name: tweak
                path: y
              - name: grow
                path: z
            """
        )
    )
    old = load_registry(path)
    path.write_text(
        textwrap.dedent(
            """\
            manager:
              memory_budget: 1GB
            models:
              - name: kept
                path: x
              - name: tweak
                path: y
                defaults: {temperature: 0.2}
              - name: grow
                path: z
                max_context: 2048
            """
        )
    )
    diff = diff_registries(old, load_registry(path))
    assert diff.renamed == (("keep", "kept"),)
    assert diff.live == ("tweak",)
    assert diff.reload == ("grow",)
    assert diff.manager_fields == ()
