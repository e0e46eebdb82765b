"""Valid registry files become the frozen Registry the daemon runs on."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import textwrap
import typing
from pathlib import Path

import psutil
import pytest

from mlxd.errors import ConfigError
from mlxd.registry.device import current_device

from mlxd.registry.loader import load_registry, load_registry_text
from mlxd.registry.model import CONTENTION_STRATEGIES, PrefixCacheSpec
from mlxd.registry.schema import ContentionStrategy
from mlxd.registry.sizing import kv_cache_bytes, weights_bytes

GIB, MIB = 1024**3, 1024**2
REPO_ROOT = Path(__file__).resolve().parents[2]


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text))
    return path


def test_minimal_file_gets_the_documented_defaults(tmp_path, model_dir):
    path = write(tmp_path / "models.yaml", f"models:\n  - name: a\n    path: {model_dir}\n")
    registry = load_registry(path, physical_memory=10 * GIB)
    assert registry.source_path == path.absolute()
    assert registry.file_hash == hashlib.sha256(path.read_bytes()).hexdigest()
    assert registry.manager.memory_budget_bytes == 7 * GIB  # 70% by default
    assert registry.manager.default_idle_unload_seconds == 900
    assert registry.manager.contention.strategy == "wait_then_fail"
    assert registry.manager.cache_dir == Path.home() / ".cache" / "mlxd"
    assert registry.server.port == 8080 and registry.server.api_keys == ()
    (spec,) = registry.models
    assert spec.name == "a" and spec.kind == "text" and spec.aliases == ()
    assert spec.path == model_dir.resolve() and spec.source == str(model_dir)
    assert spec.idle_unload_seconds == 900
    assert spec.max_context == 4096 and spec.max_concurrency == 1 and spec.max_queue == 64
    assert spec.prefix_cache == PrefixCacheSpec(
        max_bytes=256 * MIB, disk_max_bytes=GIB, persist=True
    )
    assert spec.memory_override_bytes is None


def test_default_budget_is_seventy_percent_of_the_devices_memory(tmp_path, model_dir):
    registry = load_registry_text(
        f"models:\n  - name: a\n    path: {model_dir}\n", tmp_path / "m.yaml"
    )
    device = current_device()
    if device.kind == "cpu":
        assert device.memory_bytes == psutil.virtual_memory().total
    expected = int(device.memory_bytes * 0.7)
    assert abs(registry.manager.memory_budget_bytes - expected) <= 1


def test_footprint_is_weights_plus_kv_plus_prefix_cache(tmp_path, tiny_model):
    text = f"""\
        manager:
          memory_budget: 2GB
        models:
          - name: tiny
            path: {tiny_model}
            max_context: 2048
            max_concurrency: 3
            prefix_cache:
              max_bytes: 16MB
        """
    spec = load_registry_text(textwrap.dedent(text), tmp_path / "m.yaml").models[0]
    # qwen2 tiny: 2 layers x 2 kv heads x head_dim 32, float32.
    assert spec.footprint.kv_cache == 2 * 2 * 2 * 32 * 2048 * 3 * 4
    assert spec.footprint.weights == weights_bytes(tiny_model)
    assert spec.footprint.prefix_cache == 16 * MIB
    assert (
        spec.charge_bytes
        == spec.footprint.total
        == (spec.footprint.weights + spec.footprint.kv_cache + 16 * MIB)
    )


def test_every_key_is_read(tmp_path, make_model, llama_like):
    make_model(tmp_path / "m", weight_bytes=8192)
    (tmp_path / "imgs").mkdir()
    text = """\
        server:
          host: 0.0.0.0
          port: 9001
          api_keys: [k1, k2]
          default_max_tokens: 100
          max_request_tokens: 2000
          request_timeout_s: 60
          shutdown_grace_seconds: 5
        manager:
          memory_budget: 1.5GiB
          default_idle_unload_seconds: 120
          contention_policy:
            strategy: wait_then_preempt
            wait_timeout_s: 45
            preempt_after_s: 15
          cache_dir: caches
          max_pass_over_s: 12
          load_retry_backoff_s: 2
          load_retry_backoff_max_s: 60
          prefix_cache:
            max_bytes: 32MB
            disk_max_bytes: 2GB
            persist: false
            next_turn: false
        models:
          - name: a
            path: m
            aliases: solo
            description: the one
            kind: text
            preload: true
            pinned: true
            idle_unload_seconds: 0
            max_context: 1000
            max_concurrency: 4
            max_queue: 7
            kv_bits: 8
            defaults:
              temperature: 0.0
              top_p: 0.5
              top_k: 3
              min_p: 0.1
              repetition_penalty: 1.1
              presence_penalty: -0.5
              max_tokens: 50
              seed: 42
            prefix_cache:
              disk_max_bytes: 10MB
              next_turn: auto
            trust_remote_code: true
            local_image_dir: imgs
            allow_remote_images: true
        """
    registry = load_registry(write(tmp_path / "models.yaml", text))
    s = registry.server
    assert (s.host, s.port, s.api_keys) == ("0.0.0.0", 9001, ("k1", "k2"))
    assert (s.default_max_tokens, s.max_request_tokens) == (100, 2000)
    assert (s.request_timeout_s, s.shutdown_grace_seconds) == (60, 5)
    m = registry.manager
    assert m.memory_budget_bytes == 3 * GIB // 2
    assert m.default_idle_unload_seconds == 120
    assert (m.contention.strategy, m.contention.wait_timeout_s, m.contention.preempt_after_s) == (
        "wait_then_preempt",
        45,
        15,
    )
    assert m.cache_dir == tmp_path / "caches"
    assert (m.max_pass_over_s, m.load_retry_backoff_s, m.load_retry_backoff_max_s) == (12, 2, 60)
    (spec,) = registry.models
    assert spec.aliases == ("solo",) and spec.description == "the one"
    assert spec.kind == "text" and spec.preload and spec.pinned
    assert spec.idle_unload_seconds == 0
    assert (spec.max_context, spec.max_concurrency, spec.max_queue, spec.kv_bits) == (1000, 4, 7, 8)
    d = spec.defaults
    assert (d.temperature, d.top_p, d.top_k, d.min_p) == (0.0, 0.5, 3, 0.1)
    assert (d.repetition_penalty, d.presence_penalty, d.max_tokens, d.seed) == (1.1, -0.5, 50, 42)
    # The model's prefix_cache overrides the manager's key by key.
    assert spec.prefix_cache == PrefixCacheSpec(
        max_bytes=32 * MIB, disk_max_bytes=10 * MIB, persist=False, next_turn="auto"
    )
    assert spec.trust_remote_code and spec.allow_remote_images
    assert spec.local_image_dir == (tmp_path / "imgs").resolve()
    assert spec.footprint.kv_cache == kv_cache_bytes(llama_like, 1000, 4, kv_bits=8)
    assert registry.lookup("solo") is spec


def test_kind_is_detected_from_vision_config(tmp_path, make_model, llama_like):
    vlm = make_model(
        tmp_path / "vlm", config={"vision_config": {"depth": 2}, "text_config": llama_like}
    )
    text = make_model(tmp_path / "txt")
    yaml_text = f"""\
        manager:
          memory_budget: 1GB
        models:
          - name: v
            path: {vlm}
          - name: t
            path: {text}
        """
    registry = load_registry_text(textwrap.dedent(yaml_text), tmp_path / "m.yaml")
    assert [m.kind for m in registry.models] == ["vision", "text"]
    vision, text_model = registry.models
    assert vision.footprint.prefix_cache == 0, "vision engines keep no prefix cache to charge for"
    assert text_model.footprint.prefix_cache > 0


def test_max_context_defaults_to_what_the_model_was_trained_for(tmp_path, make_model, llama_like):
    short = make_model(tmp_path / "short", config={**llama_like, "max_position_embeddings": 1024})
    spec = load_registry_text(
        f"models:\n  - name: s\n    path: {short}\n", tmp_path / "m.yaml"
    ).models[0]
    assert spec.max_context == 1024


def test_max_context_beyond_training_is_allowed_with_a_warning(
    tmp_path, make_model, llama_like, caplog
):
    short = make_model(tmp_path / "short", config={**llama_like, "max_position_embeddings": 1024})
    with caplog.at_level(logging.WARNING, logger="mlxd.registry.loader"):
        spec = load_registry_text(
            f"models:\n  - name: s\n    path: {short}\n    max_context: 2048\n", tmp_path / "m.yaml"
        ).models[0]
    assert spec.max_context == 2048
    assert "m.yaml:4" in caplog.text and "1024 positions" in caplog.text


def test_wait_timeout_of_zero_or_less_means_no_limit(tmp_path, model_dir):
    text = f"""\
        manager:
          contention_policy:
            strategy: wait
            wait_timeout_s: 0
        models:
          - name: a
            path: {model_dir}
        """
    registry = load_registry_text(textwrap.dedent(text), tmp_path / "m.yaml")
    assert registry.manager.contention.wait_timeout_s == math.inf


def test_loading_the_same_file_twice_gives_equal_registries(tmp_path, model_dir):
    path = write(tmp_path / "models.yaml", f"models:\n  - name: a\n    path: {model_dir}\n")
    assert load_registry(path) == load_registry(path)


# The vllm-mlx guide's example, with its paths pointed at local folders.
VLLM_MLX_FILE = """\
manager:
  memory_budget_gb: 100
  idle_unload_seconds: 300
  contention_policy:
    strategy: wait_then_preempt
    wait_timeout_s: 45
    preempt_after_s: 15

models:
  - name: fast
    path: {fast}
    preload: true
    continuous_batching: false
    estimated_memory_gb: 4

  - name: smart
    source: {smart}
    continuous_batching: true
    enable_mtp: true
    estimated_memory_gb: 36
    prefill_step_size: 2048
    specprefill: true
    specprefill_threshold: 8192
    specprefill_keep_pct: 0.3
    specprefill_backbone_pct: 0.5
    specprefill_draft_model: null
    stream_interval: 2
    gpu_memory_utilization: 0.9

  - name: vision
    model: {vision}
    mllm: true
    continuous_batching: true
    estimated_memory_gb: 44
"""


def test_a_vllm_mlx_registry_file_is_accepted_unchanged(tmp_path, make_model, caplog):
    folders = {k: make_model(tmp_path / k) for k in ("fast", "smart", "vision")}
    path = write(tmp_path / "models.yaml", VLLM_MLX_FILE.format(**folders))
    with caplog.at_level(logging.INFO, logger="mlxd.registry.loader"):
        registry = load_registry(path)
    m = registry.manager
    assert m.memory_budget_bytes == 100 * GIB
    assert m.default_idle_unload_seconds == 300
    assert (m.contention.strategy, m.contention.wait_timeout_s, m.contention.preempt_after_s) == (
        "wait_then_preempt",
        45,
        15,
    )
    fast, smart, vision = registry.models
    assert [s.path for s in registry.models] == [f.resolve() for f in folders.values()]
    assert (fast.charge_bytes, smart.charge_bytes, vision.charge_bytes) == (
        4 * GIB,
        36 * GIB,
        44 * GIB,
    )
    assert fast.preload
    assert vision.kind == "vision"  # mllm: true
    assert smart.kind == "text"
    # Each ignored engine option is named with its line.
    assert f"{path}:13: models[0].continuous_batching" in caplog.text
    assert f"{path}:28: models[1].gpu_memory_utilization" in caplog.text
    assert "ignored" in caplog.text


def test_vllm_mlx_budget_strings_and_nulls(tmp_path, model_dir):
    text = f"""\
        manager:
          memory_budget_gb: "512mb"
          contention_policy:
            wait_timeout_s: null
            preempt_after_s: null
        models:
          - name: a
            path: {model_dir}
        """
    registry = load_registry_text(textwrap.dedent(text), tmp_path / "m.yaml")
    assert registry.manager.memory_budget_bytes == 512 * MIB
    assert registry.manager.contention.wait_timeout_s == 30
    assert registry.manager.contention.preempt_after_s == 0


def test_models_yaml_example_is_valid(tmp_path, make_model, llama_like):
    """The documented example loads, given its Hugging Face repos in the cache."""
    example = (REPO_ROOT / "models.yaml.example").read_text()
    cache = tmp_path / "hub"
    for repo_id in (
        "mlx-community/Qwen2.5-0.5B-Instruct-4bit",
        "mlx-community/Qwen2.5-Coder-1.5B-Instruct-4bit",
    ):
        make_model(
            cache / f"models--{repo_id.replace('/', '--')}" / "snapshots" / "r1", config=llama_like
        )
    vlm = {"vision_config": {"depth": 1}, "text_config": llama_like}
    make_model(
        cache / "models--mlx-community--Qwen2-VL-2B-Instruct-4bit" / "snapshots" / "r1", config=vlm
    )
    registry = load_registry_text(
        example,
        tmp_path / "models.yaml",
        env={"HF_HUB_CACHE": str(cache), "STUDIO_KEY": "not-a-real-key"},
        physical_memory=64 * GIB,
    )
    assert [m.name for m in registry.models] == ["qwen-0.5b", "coder", "vision", "minilm", "qwen3-reranker", "qwen-32b-tp",
                                                 "qwen-122b", "studio:qwen2.5-coder-1.5b"]
    parallel = registry.lookup("qwen-32b-tp").parallel
    assert parallel is not None and (parallel.mode, parallel.hosts) == ("tensor", ("local", "local"))
    assert registry.lookup("minilm").kind == "embedding"
    assert registry.lookup("qwen-122b").remote_model == "qwen3.5-122b"
    assert registry.find("coder-anywhere").targets == ("coder", "studio:qwen2.5-coder-1.5b")
    assert registry.backend("studio").kind == "mlxd"
    assert registry.lookup("fast").name == "qwen-0.5b"
    assert registry.models[1].memory_override_bytes == 3 * GIB


def test_contention_strategies_match_the_contract():
    assert set(typing.get_args(ContentionStrategy)) == set(CONTENTION_STRATEGIES)


def test_registry_is_frozen(tmp_path, model_dir):
    registry = load_registry_text(
        f"models:\n  - name: a\n    path: {model_dir}\n", tmp_path / "m.yaml"
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        registry.models[0].max_context = 1  # type: ignore[misc]


def test_allow_download_is_passed_to_the_downloader(tmp_path, make_model):
    fetched = []

    def downloader(repo_id: str, cache_dir: Path) -> Path:
        fetched.append(repo_id)
        return make_model(cache_dir / "fetched" / repo_id)

    text = """\
        models:
          - name: cached-only
            path: org/first
            allow_download: true
        """
    env = {"HF_HUB_CACHE": str(tmp_path / "hub")}
    registry = load_registry_text(
        textwrap.dedent(text), tmp_path / "m.yaml", env=env, downloader=downloader
    )
    assert fetched == ["org/first"]
    assert registry.models[0].path == tmp_path / "hub" / "fetched" / "org" / "first"


def test_pinned_models_that_cannot_all_stay_resident_are_logged(tmp_path, make_model, caplog):
    make_model(tmp_path / "m", weight_bytes=1 << 20)
    text = """\
        manager:
          memory_budget: 10MB
          prefix_cache: {max_bytes: 1MB}
        models:
          - {name: a, path: m, pinned: true}
          - {name: b, path: m, pinned: true}
        """
    with caplog.at_level(logging.WARNING, logger="mlxd.registry.loader"):
        load_registry_text(textwrap.dedent(text), tmp_path / "m.yaml")
    assert "pinned models (a, b) need 12.0 MB together but the budget is 10.0 MB" in caplog.text


# --- backends and remote entries ------------------------------------------------

REMOTE = """\
backends:
  studio:
    url: http://studio.local:8080/v1/
    kind: mlxd
    api_key_env: STUDIO_KEY
    max_concurrency: 3
    timeouts: {connect: 2, idle: 30}
models:
  - name: big
    backend: studio
    remote_model: qwen3.5-122b
    aliases: [b]
    defaults: {temperature: 0.3}
"""


def _remote(text, env=None):
    return load_registry_text(text, Path("/etc/mlxd/models.yaml"), env={"STUDIO_KEY": "sk-7f3a9e"} if env is None else env)


def test_a_remote_entry_costs_nothing_and_takes_its_backends_capacity():
    registry = _remote(REMOTE)
    spec = registry.lookup("b")
    assert (spec.backend, spec.remote_model, spec.charge_bytes) == ("studio", "qwen3.5-122b", 0)
    assert spec.max_concurrency == 3 and spec.idle_unload_seconds == 0
    studio = registry.backend("studio")
    assert studio.url == "http://studio.local:8080/v1"
    assert (studio.connect_timeout_s, studio.first_byte_timeout_s, studio.idle_timeout_s) == (2, 600, 30)
    assert "sk-7f3a9e" not in repr(registry), "the key is read when used, never kept"


def test_remote_model_defaults_to_the_entrys_name():
    assert _remote(REMOTE.replace("    remote_model: qwen3.5-122b\n", "")).lookup("big").remote_model == "big"


@pytest.mark.parametrize(
    ("edit", "line", "key", "message"),
    [
        (("backend: studio", "backend: stdio"), 10, "models[0].backend", "unknown backend `stdio` (backends: `studio`)"),
        (("    aliases: [b]", "    max_context: 4096"), 12, "models[0].max_context", "`max_context` is a local-model setting"),
        (("    aliases: [b]", "    path: /models/x"), 12, "models[0].path", "served by backend `studio`"),
        (("    backend: studio\n", ""), 10, "models[0].remote_model", "needs a `backend`"),
        (("idle: 30", "idel: 30"), 7, "backends.studio.timeouts.idel", "did you mean `idle`?"),
        (("    kind: mlxd", "    knd: mlxd"), 4, "backends.studio.knd", "did you mean `kind`?"),
        (("kind: mlxd", "kind: vllm"), 4, "backends.studio.kind", "mlxd"),
        (("url: http://studio.local:8080/v1/", "url: studio.local"), 3, "backends.studio.url", "http://"),
    ],
)
def test_backend_mistakes_name_file_line_and_key(edit, line, key, message):
    with pytest.raises(ConfigError) as caught:
        _remote(REMOTE.replace(*edit))
    error = caught.value
    assert (error.file, error.line, error.key) == ("/etc/mlxd/models.yaml", line, key)
    assert message in error.detail


def test_a_key_variable_that_is_not_set_is_a_config_error_naming_it():
    with pytest.raises(ConfigError) as caught:
        _remote(REMOTE, env={})
    assert caught.value.key == "backends.studio.api_key_env" and caught.value.line == 5
    assert "`STUDIO_KEY` is not set" in caught.value.detail


def test_a_backend_edit_is_a_difference_of_its_own_and_no_model_reloads():
    from mlxd.registry.diff import diff_registries

    old = _remote(REMOTE)
    new = _remote(REMOTE.replace("http://studio.local:8080/v1/", "http://studio.lan:8080/v1"))
    diff = diff_registries(old, new)
    assert diff.backends == ("studio",) and not diff.is_empty
    assert diff.unchanged == ("big",)
    assert diff.summary() == "backends: studio"
    moved = _remote(REMOTE.replace("remote_model: qwen3.5-122b", "remote_model: qwen3.5-27b"))
    assert diff_registries(old, moved).reload == ("big",)
