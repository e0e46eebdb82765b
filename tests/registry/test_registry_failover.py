"""Failover entries in models.yaml: `targets:` over local models, remote
entries and `backend:model` names, a `strategy`, and every mistake named
with file, line and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlxd.errors import ConfigError
from mlxd.registry.diff import diff_registries
from mlxd.registry.loader import load_registry_text
from mlxd.registry.model import FailoverSpec

FILE = Path("/etc/mlxd/models.yaml")

TEXT = """\
backends:
  studio:
    url: http://studio.local:8080/v1
    kind: mlxd
    max_concurrency: 3
models:
  - name: small
    path: {path}
    aliases: [s]
    defaults: {{temperature: 0.2}}
  - name: far
    backend: studio
    remote_model: qwen-far
  - name: qwen
    targets: [s, studio:qwen-big]
    strategy: spillover
    aliases: [q, "qwen-*"]
    defaults: {{max_tokens: 64}}
  - name: either
    targets: [far, studio:qwen-big, small]
"""


def load(model_dir, text=TEXT):
    return load_registry_text(text.format(path=model_dir), FILE)


def test_a_failover_entry_names_its_targets_and_a_backend_model_becomes_an_implicit_target(model_dir):
    registry = load(model_dir)
    qwen = registry.find("q")
    assert isinstance(qwen, FailoverSpec)
    assert (qwen.name, qwen.targets, qwen.strategy) == ("qwen", ("small", "studio:qwen-big"), "spillover")
    assert qwen.defaults.max_tokens == 64
    assert registry.find("qwen-7b") is qwen, "its aliases may be patterns"
    assert registry.failover("either").strategy == "warm", "warm is the default"
    # One implicit remote model per `backend:model`, shared by the entries naming it.
    implicit = [m for m in registry.models if m.implicit]
    assert [(m.name, m.backend, m.remote_model, m.max_concurrency, m.charge_bytes) for m in implicit] == [
        ("studio:qwen-big", "studio", "qwen-big", 3, 0)]


def test_clients_see_failover_names_but_never_the_implicit_targets(model_dir):
    registry = load(model_dir)
    assert registry.model_names() == ["small", "s", "far", "qwen", "q", "qwen-*", "either"]
    assert registry.find("studio:qwen-big") is None
    assert registry.lookup("qwen") is None, "a failover entry is not a model"


# A tiny registry to break in one place at a time.
BROKEN = """\
backends:
  studio:
    url: http://studio.local:8080/v1
models:
  - name: small
    path: {path}
  - name: qwen
    targets: [small, studio:big]
    strategy: warm
"""


@pytest.mark.parametrize(
    ("edit", "line", "key", "message"),
    [
        (("[small, studio:big]", "[small, smal]"), 8, "models[1].targets[1]", "unknown target `smal`"),
        (("[small, studio:big]", "[small, gpu:big]"), 8, "models[1].targets[1]", "backends:` (`studio`)"),
        (("[small, studio:big]", "[small, small]"), 8, "models[1].targets[1]", "`small` is listed twice"),
        (("[small, studio:big]", "[small]"), 8, "models[1].targets", "at least 2 items"),
        (("    strategy: warm", "    strategy: nearest"), 9, "models[1].strategy", "'warm' or 'spillover'"),
        (("    strategy: warm", "    max_queue: 4"), 9, "models[1].max_queue",
         "`max_queue` is not a failover setting"),
        (("    strategy: warm", "    path: /models/x"), 9, "models[1].path", "is served by its targets"),
        (("    strategy: warm", "    backend: studio"), 9, "models[1].backend", "not a failover setting"),
        (("    path: {path}\n", "    path: {path}\n    strategy: warm\n"), 7, "models[0].strategy",
         "`strategy` is for failover entries"),
        (("models:\n", "models:\n  - name: studio:big\n    path: {path}\n"), 10, "models[2].targets[1]",
         "both an entry's name and a model on backend `studio`"),
    ],
)
def test_failover_mistakes_name_file_line_and_key(model_dir, edit, line, key, message):
    with pytest.raises(ConfigError) as caught:
        load(model_dir, BROKEN.replace(*edit))
    error = caught.value
    assert (error.file, error.line, error.key) == (str(FILE), line, key)
    assert message in error.detail


def test_a_target_that_is_a_failover_entry_itself_is_an_error(model_dir):
    text = BROKEN + "  - name: outer\n    targets: [qwen, small]\n"
    with pytest.raises(ConfigError) as caught:
        load(model_dir, text)
    assert (caught.value.line, caught.value.key) == (11, "models[2].targets[0]")
    assert "`qwen` is a failover entry itself" in caught.value.detail


def test_editing_a_failover_entry_is_a_difference_of_its_own(model_dir):
    old = load(model_dir)
    flipped = load(model_dir, TEXT.replace("strategy: spillover", "strategy: warm"))
    diff = diff_registries(old, flipped)
    assert diff.failovers == ("qwen",) and diff.summary() == "failover: qwen"
    assert diff.unchanged == ("small", "far", "studio:qwen-big"), "no model drains for it"
    moved = load(model_dir, TEXT.replace("studio:qwen-big]", "studio:qwen-huge]").replace(
        "[far, studio:qwen-big, small]", "[far, small]"))
    diff = diff_registries(old, moved)
    assert diff.failovers == ("either", "qwen")
    assert (diff.added, diff.removed) == (("studio:qwen-huge",), ("studio:qwen-big",))


def test_mlxd_check_shows_each_failover_entry_with_its_targets_and_where_they_run(model_dir):
    from mlxd.registry.check import describe

    text = describe(load(model_dir))
    assert "Backends (1):\n  studio [mlxd] http://studio.local:8080/v1, up to 3 at once" in text
    assert "Models (2):" in text, "the implicit target is shown under its failover entry"
    assert "  far\n    served by backend `studio` (http://studio.local:8080/v1) as `qwen-far`" in text
    assert (
        "  qwen [failover, spillover]  aliases: q, qwen-*\n"
        "    tries the first target with a free slot, else the first listed; the next when one fails before any output\n"
        "    -> small (here)\n"
        "    -> studio:qwen-big (on backend `studio` as `qwen-big`)\n"
    ) in text
    assert "  either [failover, warm]" in text


@pytest.mark.parametrize("extra, target", [
    ("  - name: vectors\n    path: {emb}\n    kind: embedding\n", "vectors"),
    ("  - name: vectors\n    backend: studio\n    kind: rerank\n", "vectors"),
])
def test_a_failover_target_that_is_not_a_chat_model_is_refused_at_its_line(tmp_path, model_dir, make_model,
                                                                          extra, target):
    # Only the generation routes resolve a failover entry: a chat request
    # routed to an embedding model would fail, and an embeddings request
    # naming the failover entry is a 400.
    emb = make_model(tmp_path / "emb", config={"model_type": "bert", "architectures": ["BertModel"],
                                               "hidden_size": 64, "num_hidden_layers": 2,
                                               "num_attention_heads": 2, "max_position_embeddings": 512})
    text = TEXT.replace("  - name: either\n", extra.format(emb=emb) + "  - name: either\n")
    text = text.replace("targets: [far, studio:qwen-big, small]", f"targets: [small, {target}]")
    with pytest.raises(ConfigError) as caught:
        load(model_dir, text)
    assert caught.value.key == "models[4].targets[1]"
    assert f"`{target}` is a" in caught.value.detail and "targets are chat models" in caught.value.detail
