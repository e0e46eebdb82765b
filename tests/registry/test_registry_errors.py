"""Every bad registry file is a ConfigError naming its file, line and key."""

from __future__ import annotations

import textwrap

import pytest

from mlxd.errors import ConfigError
from mlxd.registry.loader import load_registry, load_registry_text

GIB = 1024**3

# (id, file text, line, key, fragment of the message). ``{model}`` is replaced
# by a valid model folder, ``{nomodel}`` by a folder without config.json.
BAD_FILES = [
    (
        "unknown top-level key",
        """\
        modles:
          - name: a
        """,
        1,
        "modles",
        "unknown key `modles`; did you mean `models`?",
    ),
    (
        "unknown model key suggests the closest",
        """\
        models:
          - name: a
            path: {model}
            max_contxt: 8192
        """,
        4,
        "models[0].max_contxt",
        "did you mean `max_context`?",
    ),
    (
        "unknown key without a close match lists the valid ones",
        """\
        server:
          colour: blue
        models:
          - name: a
            path: {model}
        """,
        2,
        "server.colour",
        "valid keys here: allowed_hosts, allowed_origins, api_keys, body_timeout_s",
    ),
    (
        "unknown nested key",
        """\
        manager:
          memory_budget: 1GB
          contention_policy:
            stratgy: fail
        models:
          - name: a
            path: {model}
        """,
        4,
        "manager.contention_policy.stratgy",
        "did you mean `strategy`?",
    ),
    (
        "bad contention strategy",
        """\
        manager:
          contention_policy:
            strategy: evict
        models:
          - name: a
            path: {model}
        """,
        3,
        "manager.contention_policy.strategy",
        "'wait_then_preempt'",
    ),
    (
        "value of the wrong type",
        """\
        models:
          - name: a
            path: {model}
          - name: b
            path: {model}
            max_context: lots
        """,
        6,
        "models[1].max_context",
        "should be a valid integer, unable to parse string as an integer, got 'lots'",
    ),
    (
        "out of range",
        """\
        models:
          - name: a
            path: {model}
            max_concurrency: 0
        """,
        4,
        "models[0].max_concurrency",
        "greater than or equal to 1, got 0",
    ),
    (
        "yaml syntax error",
        """\
        models:
          - name: a
            path: {model}
            aliases: [x, y
          - name: b
        """,
        5,
        None,
        "(while parsing a flow sequence that starts on line 4)",
    ),
    (
        # The parser meets the end of the file; the mistake is where the quote opened.
        "unclosed quote",
        """\
        models:
          - name: "a
            path: {model}
          - name: b
            path: {model}
        """,
        2,
        None,
        "found unexpected end of stream (while scanning a quoted scalar that starts on line 2)",
    ),
    (
        "top level is a list",
        """\
        - name: a
        """,
        1,
        None,
        "top level must be a mapping",
    ),
    (
        "missing models",
        """\
        server:
          port: 9000
        """,
        1,
        "models",
        "needs a `models` list",
    ),
    (
        "empty models",
        """\
        server:
          port: 9000
        models: []
        """,
        3,
        "models",
        "`models` is empty",
    ),
    (
        "entry without a name",
        """\
        models:
          - name: a
            path: {model}
          - path: {model}
            preload: true
        """,
        4,
        "models[1].name",
        "required key `name` is missing",
    ),
    (
        "entry is not a mapping",
        """\
        models:
          - just-a-string
        """,
        2,
        "models[0]",
        "expected a mapping",
    ),
    (
        "duplicate name",
        """\
        models:
          - name: a
            path: {model}
          - name: a
            path: {model}
        """,
        4,
        "models[1].name",
        "the name `a` is already used by models[0].name on line 2",
    ),
    (
        "alias collides with another model's name",
        """\
        models:
          - name: a
            path: {model}
          - name: b
            path: {model}
            aliases: [c, a]
        """,
        6,
        "models[1].aliases[1]",
        "already used by models[0].name on line 2",
    ),
    (
        "alias equal to its own name",
        """\
        models:
          - name: a
            aliases:
              - a
            path: {model}
        """,
        4,
        "models[0].aliases[0]",
        "already used by models[0].name",
    ),
    (
        "no location at all",
        """\
        models:
          - name: a
            preload: true
        """,
        2,
        "models[0]",
        "needs a `path`",
    ),
    (
        "two locations",
        """\
        models:
          - name: a
            path: {model}
            model: {model}
        """,
        4,
        "models[0].model",
        "set only one of `path`, `model`",
    ),
    (
        "model larger than the budget",
        """\
        manager:
          memory_budget: 64MB
          prefix_cache:
            max_bytes: 1MB
        models:
          - name: small
            path: {model}
          - name: big
            path: {model}
            prefix_cache:
              max_bytes: 128MB
        """,
        8,
        "models[1]",
        "`big` needs 132.0 MB but the budget is 64.0 MB",
    ),
    (
        "estimated_memory_gb larger than the budget",
        """\
        manager:
          memory_budget_gb: 2
        models:
          - name: big
            path: {model}
            estimated_memory_gb: 3.1
        """,
        4,
        "models[0]",
        "`big` needs 3.1 GB but the budget is 2.0 GB (estimated_memory_gb)",
    ),
    (
        "bad size string",
        """\
        manager:
          prefix_cache:
            max_bytes: 12 parsecs
        models:
          - name: a
            path: {model}
        """,
        3,
        "manager.prefix_cache.max_bytes",
        "cannot read '12 parsecs' as a size",
    ),
    (
        "next_turn is auto, true or false",
        """\
        models:
          - name: a
            path: {model}
            prefix_cache:
              next_turn: sometimes
        """,
        5,
        "models[0].prefix_cache.next_turn",
        "next_turn is auto, true or false, not 'sometimes'",
    ),
    (
        "tiny integer budget",
        """\
        manager:
          memory_budget: 48
        models:
          - name: a
            path: {model}
        """,
        2,
        "manager.memory_budget",
        "write '48GB' or use memory_budget_gb: 48",
    ),
    (
        "both budget spellings",
        """\
        manager:
          memory_budget: 4GB
          memory_budget_gb: 4
        models:
          - name: a
            path: {model}
        """,
        3,
        "manager.memory_budget_gb",
        "set either `memory_budget` or `memory_budget_gb`",
    ),
    (
        "gpu_memory_utilization out of (0, 1]",
        """\
        models:
          - name: a
            path: {model}
            gpu_memory_utilization: 1.5
        """,
        4,
        "models[0].gpu_memory_utilization",
        "less than or equal to 1",
    ),
    (
        "kv_bits the cache cannot pack",
        """\
        models:
          - name: a
            path: {model}
            kv_bits: 3
        """,
        4,
        "models[0].kv_bits",
        "must be one of 2, 4, 8",
    ),
    (
        "kind that does not exist",
        """\
        models:
          - name: a
            path: {model}
            kind: audio
        """,
        4,
        "models[0].kind",
        "'text', 'vision', 'embedding', 'rerank', 'transcription' or 'speech'",
    ),
    (
        "duplicate yaml key",
        """\
        models:
          - name: a
            path: {model}
            name: b
        """,
        4,
        "models[0].name",
        "`name` appears twice in this mapping (first on line 2)",
    ),
    (
        "default max_tokens above the request limit",
        """\
        server:
          max_request_tokens: 1000
        models:
          - name: a
            path: {model}
            defaults:
              temperature: 0.2
              max_tokens: 2000
        """,
        8,
        "models[0].defaults.max_tokens",
        "above server.max_request_tokens (1000)",
    ),
    (
        "preemption that could never start",
        """\
        manager:
          contention_policy:
            strategy: wait_then_preempt
            wait_timeout_s: 10
            preempt_after_s: 20
        models:
          - name: a
            path: {model}
        """,
        5,
        "manager.contention_policy.preempt_after_s",
        "preemption would never start",
    ),
    (
        "port out of range",
        """\
        server:
          host: 0.0.0.0
          port: 70000
        models:
          - name: a
            path: {model}
        """,
        3,
        "server.port",
        "less than or equal to 65535",
    ),
    (
        "local_image_dir that does not exist",
        """\
        models:
          - name: a
            path: {model}
            kind: vision
            local_image_dir: ./images
        """,
        5,
        "models[0].local_image_dir",
        "does not exist",
    ),
    (
        "a section that is not a mapping",
        """\
        manager: 12GB
        models:
          - name: a
            path: {model}
        """,
        1,
        "manager",
        "expected a mapping of keys, got '12GB'",
    ),
    (
        "several problems report the first and count the rest",
        """\
        models:
          - name: a
            path: {model}
            max_queue: -1
            top_p: 0.5
        """,
        4,
        "models[0].max_queue",
        "(and 1 more problem in this file)",
    ),
]


# A model's files on disk, not the YAML: that model is broken, the file loads.
MODEL_FILE_PROBLEMS = [
    (
        "path that does not exist",
        """\
        models:
          - name: a
            description: first
            path: ./not-here
        """,
        4,
        "models[0].path",
        "does not exist",
    ),
    (
        "folder without config.json",
        """\
        models:
          - name: a
            path: {nomodel}
        """,
        3,
        "models[0].path",
        "has no config.json",
    ),
    (
        "repo id not in the cache",
        """\
        models:
          - name: a
            source: org/not-cached
        """,
        3,
        "models[0].source",
        "not in the local Hugging Face cache",
    ),
]

@pytest.mark.parametrize(
    ("text", "line", "key", "fragment"),
    [case[1:] for case in BAD_FILES],
    ids=[case[0] for case in BAD_FILES],
)
def test_bad_file_names_file_line_and_key(tmp_path, make_model, text, line, key, fragment):
    model = make_model(tmp_path / "model", weight_bytes=4096)
    (tmp_path / "empty-folder").mkdir()
    path = tmp_path / "models.yaml"
    path.write_text(textwrap.dedent(text).format(model=model, nomodel=tmp_path / "empty-folder"))
    with pytest.raises(ConfigError) as caught:
        load_registry(path, env={"HF_HUB_CACHE": str(tmp_path / "hub")}, physical_memory=16 * GIB)
    error = caught.value
    assert (error.file, error.line, error.key) == (str(path), line, key), error.detail
    assert fragment in error.detail


def test_error_renders_as_file_line_key_message(tmp_path, model_dir):
    path = tmp_path / "models.yaml"
    path.write_text(f"models:\n  - name: a\n    path: {model_dir}\n    max_queue: -2\n")
    with pytest.raises(ConfigError) as caught:
        load_registry(path)
    assert str(caught.value) == (
        f"{path}:4: models[0].max_queue: input should be greater than or equal to 0, got -2"
    )
    assert caught.value.as_dict()["line"] == 4


def _refused(tmp_path, model_dir, head: str) -> ConfigError:
    """The error for a file of ``head`` (YAML, dedented) above one model."""
    text = textwrap.dedent(head) + f"models:\n  - name: a\n    path: {model_dir}\n"
    with pytest.raises(ConfigError) as caught:
        load_registry_text(text, tmp_path / "m.yaml")
    return caught.value


def test_a_bad_api_key_is_not_echoed(tmp_path, model_dir):
    error = _refused(tmp_path, model_dir, """\
        server:
          api_keys: [sk-good, 998877665544]
        """)
    assert error.key == "server.api_keys[1]"
    assert "998877665544" not in str(error)


@pytest.mark.parametrize("url, words", [
    ("http://admin:s3cr3t-pass@gpu-box:8000/v1", "credentials"),
    ("https://gpu-box/v1?api_key=s3cr3t-pass", "query string"),
    ("https://gpu-box/v1#s3cr3t-pass", "query string"),
])
def test_credentials_in_a_backend_url_are_refused_and_not_echoed(tmp_path, model_dir, url, words):
    # A url with a key in it would be shown by /v1/status and WARNING lines.
    error = _refused(tmp_path, model_dir, f"""\
        backends:
          gpu:
            url: "{url}"
        """)
    assert error.key == "backends.gpu.url"
    assert words in error.detail and "api_key_env" in error.detail
    assert "s3cr3t" not in str(error)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError) as caught:
        load_registry(tmp_path / "nope.yaml")
    assert caught.value.file == str(tmp_path / "nope.yaml")
    assert "not found" in caught.value.detail


def test_empty_file(tmp_path):
    path = tmp_path / "models.yaml"
    path.write_text("# nothing yet\n")
    with pytest.raises(ConfigError, match="empty") as caught:
        load_registry(path)
    assert caught.value.line == 1


def test_text_without_a_path_is_labelled(model_dir):
    with pytest.raises(ConfigError) as caught:
        load_registry_text("models:\n  - name: a\n    path: /nope\n    max_queue: -1\n")
    assert caught.value.file == "<string>"
    assert caught.value.line == 4
    (problem,) = load_registry_text("models:\n  - name: a\n    path: /nope\n").problems
    assert (problem.file, problem.line) == ("<string>", 3)


def test_error_message_carries_no_traceback_text(tmp_path):
    bad = tmp_path / "model"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    (bad / "model.safetensors").write_bytes(b"\x00" * 4)
    (problem,) = load_registry_text(f"models:\n  - name: a\n    path: {bad}\n", tmp_path / "m.yaml").problems
    assert "Traceback" not in str(problem)
    assert "not valid JSON" in problem.detail
    assert problem.line == 3


def test_strings_with_yaml_anchors_still_locate_keys(tmp_path, model_dir):
    text = textwrap.dedent(
        f"""\
        base: &base
          path: {model_dir}
        models:
          - <<: *base
            name: a
            max_context: 0
        """
    )
    with pytest.raises(ConfigError) as caught:
        load_registry_text(text, tmp_path / "m.yaml")
    # ``base`` is an unknown top-level key and comes first.
    assert (caught.value.line, caught.value.key) == (1, "base")
    assert "(and 1 more problem" in caught.value.detail


@pytest.mark.parametrize(
    ("text", "line", "key", "fragment"),
    [case[1:] for case in MODEL_FILE_PROBLEMS],
    ids=[case[0] for case in MODEL_FILE_PROBLEMS],
)
def test_a_model_files_problem_breaks_that_model_only(tmp_path, make_model, text, line, key, fragment):
    model = make_model(tmp_path / "model", weight_bytes=4096)
    (tmp_path / "empty-folder").mkdir()
    path = tmp_path / "models.yaml"
    text = textwrap.dedent(text).format(model=model, nomodel=tmp_path / "empty-folder")
    path.write_text(text + f"  - name: good\n    path: {model}\n")
    registry = load_registry(path, env={"HF_HUB_CACHE": str(tmp_path / "hub")}, physical_memory=16 * GIB)
    (problem,) = registry.problems
    assert (problem.file, problem.line, problem.key) == (str(path), line, key), problem.detail
    assert fragment in problem.detail
    broken, good = registry.models
    assert fragment in broken.broken and broken.charge_bytes < good.charge_bytes
    assert good.broken is None


def test_api_keys_in_a_file_others_can_read_are_warned_about(tmp_path, model_dir, caplog):
    import logging
    import os

    path = tmp_path / "models.yaml"
    path.write_text(f"server:\n  api_keys: [sk-local-key]\nmodels:\n  - name: a\n    path: {model_dir}\n")
    os.chmod(path, 0o644)
    with caplog.at_level(logging.WARNING, logger="mlxd.registry"):
        load_registry(path)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(path) in m and "server.api_keys" in m and "chmod 600" in m for m in warned), warned
    assert not any("sk-local-key" in m for m in warned)

    caplog.clear()
    os.chmod(path, 0o600)
    with caplog.at_level(logging.WARNING, logger="mlxd.registry"):
        load_registry(path)
    assert not [r for r in caplog.records if "api_keys" in r.getMessage()]


# A YAML boolean where a number is wanted: pydantic's lax mode read it as 1
# or 0 (`speculative: {tokens: true}` served with one drafted token).
@pytest.mark.parametrize("head, model_keys, line, key", [
    ("", "    speculative: {method: prompt_lookup, tokens: true}\n", 4, "models[0].speculative.tokens"),
    ("", "    max_concurrency: yes\n", 4, "models[0].max_concurrency"),
    ("", "    estimated_memory_gb: true\n", 4, "models[0].estimated_memory_gb"),
    ("", "    defaults: {temperature: true}\n", 4, "models[0].defaults.temperature"),
    ("server:\n  request_timeout_s: on\n", "", 2, "server.request_timeout_s"),
    ("manager:\n  contention_policy: {wait_timeout_s: false}\n", "", 2,
     "manager.contention_policy.wait_timeout_s"),
    ("apps:\n  - {name: a, key: none, rpm: true}\n", "", 2, "apps[0].rpm"),
])
def test_a_boolean_where_a_number_is_wanted_names_file_line_and_key(tmp_path, model_dir, head, model_keys,
                                                                      line, key):
    text = head + f"models:\n  - name: a\n    path: {model_dir}\n" + model_keys
    with pytest.raises(ConfigError) as caught:
        load_registry_text(text, tmp_path / "m.yaml")
    error = caught.value
    assert (error.file, error.line, error.key) == (str(tmp_path / "m.yaml"), line, key)
    assert "expected a number" in error.detail and "boolean" in error.detail


def test_numbers_written_other_ways_still_read(tmp_path, model_dir):
    # A quoted number and a whole float are the number written; an int is a float.
    text = (f'models:\n  - name: a\n    path: {model_dir}\n    max_concurrency: "3"\n    max_queue: 8.0\n'
            "    speculative: {method: prompt_lookup, tokens: 6}\n    defaults: {temperature: 1}\n")
    (spec,) = load_registry_text(text, tmp_path / "m.yaml").models
    assert (spec.max_concurrency, spec.max_queue, spec.speculative.tokens) == (3, 8, 6)
    assert spec.defaults.temperature == 1.0


@pytest.mark.parametrize("head, key, expected", [
    ("manager:\n  memory_budget: yes\n", "manager.memory_budget", "expected a size such as 512MB or 2GB, got yes"),
    ("manager:\n  memory_budget_gb: [16]\n", "manager.memory_budget_gb", "expected a number of GB, got a list"),
    ("server:\n  max_body_bytes: {a: 1}\n", "server.max_body_bytes", "expected a size such as 512MB or 2GB, got a mapping"),
    ("server:\n  max_connections: on\n", "server.max_connections", "expected a number, got on (YAML reads"),
    ("server:\n  host: no\n", "server.host", "got no (YAML reads it as a boolean; write 'no' in quotes for the word)"),
    ("manager:\n  contention_policy: {strategy: off}\n", "manager.contention_policy.strategy", "got off"),
])
def test_a_yaml_boolean_is_quoted_as_written(tmp_path, model_dir, head, key, expected):
    # YAML 1.1 reads yes/no/on/off as booleans: the message quotes the word
    # the file has, not Python's True, and a wrong type is named in words.
    error = _refused(tmp_path, model_dir, head)
    assert error.key == key
    assert expected in error.detail
    assert "True" not in error.detail and "False" not in error.detail


def test_a_fraction_where_a_whole_number_goes_is_named_once(tmp_path, model_dir):
    error = _refused(tmp_path, model_dir, "server:\n  max_connections: 1.5\n")
    assert error.key == "server.max_connections"
    assert error.detail.endswith("got 1.5 (a number with a fractional part)"), error.detail
    assert error.detail.count("got") == 1


@pytest.mark.parametrize("head, key, words", [
    # The empty host is the wildcard: it would listen on every interface.
    ("server:\n  host: ''\n", "server.host", "every interface"),
    ("manager:\n  cache_dir: ''\n", "manager.cache_dir", "registry's own folder"),
])
def test_an_empty_host_or_folder_is_refused_not_read_as_a_wildcard(tmp_path, model_dir, head, key, words):
    error = _refused(tmp_path, model_dir, head)
    assert (error.key, error.line) == (key, 2)
    assert words in error.detail


@pytest.mark.parametrize("key", ["path", "local_image_dir"])
def test_an_empty_path_in_an_entry_is_refused(tmp_path, model_dir, key):
    # local_image_dir: '' would let requests read images from the registry's folder.
    lines = {"path": str(model_dir), key: "''"}
    text = "models:\n  - name: a\n" + "".join(f"    {k}: {v}\n" for k, v in lines.items())
    with pytest.raises(ConfigError) as caught:
        load_registry_text(text, tmp_path / "m.yaml")
    assert caught.value.key == f"models[0].{key}"
    assert "registry's own folder" in caught.value.detail


def test_null_or_no_value_means_the_default(tmp_path, model_dir):
    # docs/registry.md: `null` for an optional key means the default; a key
    # written with no value (`aliases:`) is null in YAML.
    text = textwrap.dedent(f"""\
        server:
          port: null
          api_keys:
          max_body_bytes: ~
        manager:
          cache_dir: null
          prefix_cache:
        models:
          - name: a
            path: {model_dir}
            aliases:
            description:
            pinned: null
            max_concurrency: null
            defaults:
        """)
    registry = load_registry_text(text, tmp_path / "m.yaml", physical_memory=16 * GIB)
    (spec,) = registry.models
    assert (registry.server.port, registry.server.api_keys, registry.server.max_body_bytes) == (8080, (), 32 << 20)
    assert (spec.aliases, spec.description, spec.pinned, spec.max_concurrency) == ((), "", False, 1)
    assert registry.manager.cache_dir.name == "mlxd"


def test_null_for_a_required_key_is_still_named(tmp_path):
    with pytest.raises(ConfigError) as caught:
        load_registry_text("models:\n  - name: null\n    path: /x\n", tmp_path / "m.yaml")
    assert (caught.value.key, caught.value.line) == ("models[0].name", 2)
