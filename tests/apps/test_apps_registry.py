"""``apps:`` in the registry: each key found where the entry says and kept
as its sha256 only; every mistake a ConfigError naming file, line and key,
never the key's value; the reload diff names the apps that changed."""

from __future__ import annotations

import hashlib
import json
import struct
import textwrap

import pytest

from mlxd.errors import ConfigError
from mlxd.registry.diff import diff_registries
from mlxd.registry.loader import load_registry_text

GIB = 1024**3
SECRET = "sk-very-secret-4242"


@pytest.fixture
def model(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    header = json.dumps({"__metadata__": {}}).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    return folder


def load(tmp_path, model, apps: str, env: dict[str, str] | None = None):
    text = textwrap.dedent(apps) + f"models:\n  - name: chat\n    path: {model}\n  - name: embed\n    path: {model}\n"
    return load_registry_text(text, tmp_path / "models.yaml", env=env or {}, physical_memory=16 * GIB)


def test_keys_come_from_the_environment_a_file_or_a_hash_and_only_their_hash_is_kept(tmp_path, model):
    (tmp_path / "rag.key").write_text(SECRET + "-file\n")
    digest = hashlib.sha256(b"sk-chat").hexdigest()
    registry = load(tmp_path, model, f"""\
        apps:
          - name: editor
            key_env: EDITOR_KEY
            models: chat
            priority: interactive
            rpm: 60
          - name: rag
            key_file: rag.key
            routes: [embeddings]
            priority: bulk
            tokens_per_day: 100000
          - name: chat-app
            key_sha256: {digest.upper()}
          - name: local
            key: none
        """, env={"EDITOR_KEY": SECRET})
    editor, rag, chat, local = registry.apps
    assert editor.key_sha256 == hashlib.sha256(SECRET.encode()).hexdigest()
    assert (editor.models, editor.priority, editor.rpm, editor.admin) == (("chat",), "interactive", 60, False)
    assert rag.key_sha256 == hashlib.sha256((SECRET + "-file").encode()).hexdigest()
    assert (rag.routes, rag.priority, rag.tokens_per_day) == (("embeddings",), "bulk", 100000)
    assert chat.key_sha256 == digest and chat.models == ("*",) and chat.priority == "default"
    assert local.key_sha256 is None
    assert SECRET not in repr(registry)


def test_no_apps_section_keeps_flat_keys(tmp_path, model):
    assert load(tmp_path, model, "server:\n  api_keys: [sk-a]\n").apps is None


BAD = [
    ("a plain key", "apps:\n  - name: a\n    key: " + SECRET + "\n", 3, "apps[0].key", "may only be `none`"),
    ("no key", "apps:\n  - name: a\n    models: [chat]\n", 2, "apps[0]", "has no key; give exactly one of"),
    ("two keys", "apps:\n  - name: a\n    key_env: X\n    key: none\n", 3, "apps[0].key_env",
     "2 keys (key, key_env)"),
    ("an unset variable", "apps:\n  - name: a\n    key_env: NOT_SET\n", 3, "apps[0].key_env",
     "`NOT_SET` is not set"),
    ("a missing key file", "apps:\n  - name: a\n    key_file: nowhere.key\n", 3, "apps[0].key_file",
     "cannot read the key file"),
    # A key pasted where its variable's name or its file belongs is not repeated either.
    ("a key as the variable", "apps:\n  - name: a\n    key_env: " + SECRET + "\n", 3, "apps[0].key_env",
     "is the key itself written here?"),
    ("a key as the file", "apps:\n  - name: a\n    key_file: " + SECRET + "\n", 3, "apps[0].key_file",
     "a bare name, not shown"),
    ("a bad hash", "apps:\n  - name: a\n    key_sha256: " + SECRET + "\n", 3, "apps[0].key_sha256",
     "must be 64 hex digits"),
    ("a bad priority", "apps:\n  - name: a\n    key: none\n    priority: urgent\n", 4, "apps[0].priority",
     "'interactive', 'default' or 'bulk'"),
    ("a bad route", "apps:\n  - name: a\n    key: none\n    routes: [chat]\n", 4, "apps[0].routes[0]",
     "'generation', 'embeddings' or 'audio'"),
    ("a zero limit", "apps:\n  - name: a\n    key: none\n    rpm: 0\n", 4, "apps[0].rpm", "greater than or equal to 1"),
    ("a name twice", "apps:\n  - name: a\n    key: none\n  - name: a\n    key_env: K\n", 4, "apps[1].name",
     "already used by apps[0]"),
    ("one key twice", "apps:\n  - name: a\n    key_env: K\n  - name: b\n    key_env: K\n", 4, "apps[1].name",
     "already has the same key"),
    # A key names one caller: the app's scope would quietly replace the admin key's rights.
    ("an admin key", "server:\n  api_keys: [sk-k]\napps:\n  - name: a\n    key_env: K\n", 4, "apps[0].name",
     "app `a` has the same key as server.api_keys[0]"),
    ("a read-only key", "server:\n  read_only_keys: [sk-x, sk-k]\napps:\n  - name: a\n    key_env: K\n", 4,
     "apps[0].name", "the same key as server.read_only_keys[1]"),
    ("an unknown key", "apps:\n  - name: a\n    key: none\n    modles: [chat]\n", 4, "apps[0].modles",
     "did you mean `models`?"),
]


@pytest.mark.parametrize(("text", "line", "key", "words"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_app_names_file_line_and_key_and_never_the_key(tmp_path, model, text, line, key, words):
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, model, text, env={"K": "sk-k"})
    error = caught.value
    assert (error.file, error.line, error.key) == (str(tmp_path / "models.yaml"), line, key), error.detail
    assert words in error.detail
    assert SECRET not in str(error)


def test_the_reload_diff_names_the_apps_added_removed_or_changed(tmp_path, model):
    before = load(tmp_path, model, "apps:\n  - name: a\n    key: none\n  - name: b\n    key_env: K\n", {"K": "1"})
    after = load(tmp_path, model, "apps:\n  - name: b\n    key_env: K\n  - name: c\n    key_env: J\n",
                 {"K": "2", "J": "3"})
    diff = diff_registries(before, after)
    assert diff.apps == ("a", "b", "c") and "apps: a, b, c" in diff.summary()
    assert not diff_registries(after, after).apps
    assert diff_registries(load(tmp_path, model, ""), before).apps == ("a", "b", "(apps on)")


def test_mlxd_check_lists_each_app_with_its_scope_and_never_its_key(tmp_path, model):
    from mlxd.registry.check import describe

    registry = load(tmp_path, model, "apps:\n  - {name: editor, key_env: K, models: [chat], priority: interactive,"
                                     " rpm: 30}\n  - {name: local, key: none, admin: true}\n", {"K": SECRET})
    text = describe(registry)
    assert "  editor [interactive] keyed, models chat, routes generation, embeddings, audio, rpm 30" in text
    assert "  local [default, admin] keyless loopback, models *" in text
    assert SECRET not in text


def test_mlxd_check_warns_that_an_empty_apps_list_with_no_key_refuses_every_request(tmp_path, model):
    from mlxd.registry.check import describe

    assert "every request will be refused (401)" in describe(load(tmp_path, model, "apps: []\n"))
    keyed = load(tmp_path, model, "server:\n  api_keys: [sk-admin-1234567]\napps: []\n")
    assert "every request will be refused" not in describe(keyed)
