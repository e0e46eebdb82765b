"""``parallel:`` in models.yaml: what it resolves to, and every way it can
be wrong named by file, line and key (the split checked from config.json)."""

from __future__ import annotations

import textwrap

import pytest

from mlxd.errors import ConfigError
from mlxd.registry.loader import load_registry
from mlxd.registry.kinds import PARALLEL

GIB = 1024**3
# Qwen2.5-0.5B's attention: 14 heads, 2 KV heads, MLP 4864.
QWEN_05B = {
    "model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 2, "intermediate_size": 4864,
    "num_attention_heads": 14, "num_key_value_heads": 2, "max_position_embeddings": 4096,
    "torch_dtype": "float32",
}


def _load(tmp_path, make_model, parallel: str, extra: str = ""):
    model = make_model(tmp_path / "model", config=QWEN_05B)
    path = tmp_path / "models.yaml"
    path.write_text(textwrap.dedent(f"""\
        models:
          - name: big
            path: {model}
            parallel: {parallel}
        """) + extra)
    return path, load_registry(path, physical_memory=16 * GIB)


def test_two_local_ranks_over_the_default_transport(tmp_path, make_model):
    _, registry = _load(tmp_path, make_model, "{ranks: 2}")
    spec = registry.models[0]
    assert spec.parallel is not None and spec.broken is None
    assert (spec.parallel.mode, spec.parallel.hosts) == ("tensor", ("local", "local"))
    assert spec.parallel.transport in ("ring", "nccl")  # resolved for this device from `any`
    assert registry.kind_of(spec) is PARALLEL
    # The ranks keep past requests' caches within the entry's bounds, saved as any model's are.
    assert spec.prefix_cache.max_bytes == 256 << 20 and spec.prefix_cache.persist
    assert spec.prefix_cache.disk_max_bytes == 1 << 30
    assert spec.footprint.prefix_cache == spec.prefix_cache.max_bytes


def test_a_tensor_split_that_does_not_divide_the_heads_is_refused_at_its_key(tmp_path, make_model):
    path, registry = _load(tmp_path, make_model, "{mode: tensor, ranks: 4}")
    spec = registry.models[0]
    assert "`num_attention_heads` (14) by 4" in (spec.broken or "")
    [problem] = registry.problems
    assert (problem.file, problem.line, problem.key) == (str(path), 4, "models[0].parallel.ranks")


def test_a_pipeline_whose_weight_index_lacks_a_layer_is_refused(tmp_path, make_model):
    import json

    folder = make_model(tmp_path / "model", config=QWEN_05B)
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"model.layers.0.mlp.up_proj.weight": "a.safetensors", "model.norm.weight": "a.safetensors"}}))
    _, registry = _load(tmp_path, make_model, "{mode: pipeline, ranks: [local, local]}")
    assert "no weights for layers [1]" in (registry.models[0].broken or "")


def test_a_family_without_the_split_is_refused(tmp_path, make_model):
    config = {**QWEN_05B, "model_type": "gpt2", "n_head": 14}
    model = make_model(tmp_path / "model", config=config)
    path = tmp_path / "models.yaml"
    path.write_text(f"models:\n  - name: old\n    path: {model}\n    parallel: {{ranks: 2}}\n")
    registry = load_registry(path, physical_memory=16 * GIB)
    assert "mlx-lm's `gpt2` models have no tensor split" in (registry.models[0].broken or "")


@pytest.mark.parametrize(
    ("parallel", "line", "key", "fragment"),
    [
        ("{ranks: 1}", 4, "models[0].parallel.ranks", "2 to 64 ranks, got 1"),
        ("{ranks: [local, mini]}", 4, "models[0].parallel.ranks[1]", "neither `local` nor a backend"),
        ("{ranks: [local, studio2], transport: nccl}", 4, "models[0].parallel.transport", "over `ring` or `jaccl`"),
        ("{ranks: [local, studio2], transport: jaccl}", 4, "models[0].parallel.transport", "needs `rdma_devices`"),
        ("{ranks: [local, studio2], transport: jaccl, rdma_devices: [[null, en5], [en5]]}", 4,
         "models[0].parallel.rdma_devices", "2 rows of 2"),
        ("{ranks: [local, studio2], transport: jaccl, rdma_devices: [[en3, en5], [en5, null]]}", 4,
         "models[0].parallel.rdma_devices", "null where a rank meets itself"),
        ("{ranks: [local, studio2, studio2], transport: jaccl, rdma_devices: [[null, a, b], [a, null, c], [b, c, null]]}",
         4, "models[0].parallel.transport", "one rank per machine"),
        ("{ranks: [local, studio]}", 4, "models[0].parallel.ranks[1]", "not an mlxd"),
        ("{ranks: [studio2, local]}", 4, "models[0].parallel.ranks[0]", "rank 0 runs here"),
        ("{ranks: 2, transport: jaccl}", 4, "models[0].parallel.transport", "Thunderbolt"),
        ("{ranks: 2, transport: udp}", 4, "models[0].parallel.transport", "udp"),
        ("{ranks: 2, mode: expert}", 4, "models[0].parallel.mode", "expert"),
        ("{ranks: 2, step_timeout_s: 0}", 4, "models[0].parallel.step_timeout_s", "greater than 0"),
    ],
)
def test_bad_parallel_names_file_line_and_key(tmp_path, make_model, parallel, line, key, fragment):
    backends = ("backends:\n  studio: {url: 'http://studio:8080/v1'}\n"
                "  studio2: {url: 'http://studio2:8080/v1', kind: mlxd}\n")
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, make_model, parallel, backends)
    error = caught.value
    assert (error.file, error.line, error.key) == (str(tmp_path / "models.yaml"), line, key), error.detail
    assert fragment in error.detail


def test_speculation_which_the_ranks_do_not_run_is_refused_at_its_key(tmp_path, make_model):
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, make_model, "{ranks: 2}", "    speculative: {method: prompt_lookup}\n")
    assert caught.value.key == "models[0].speculative"


def test_a_rank_on_an_mlxd_backend_is_placed_there_over_the_ring(tmp_path, make_model):
    backends = "backends:\n  studio2: {url: 'http://studio2:8080/v1', kind: mlxd, api_key_env: STUDIO_KEY}\n"
    model = make_model(tmp_path / "model", config=QWEN_05B)
    path = tmp_path / "models.yaml"
    path.write_text(f"models:\n  - name: big\n    path: {model}\n    parallel: {{ranks: [local, studio2]}}\n"
                    + backends)
    registry = load_registry(path, physical_memory=16 * GIB, env={"STUDIO_KEY": "k"})
    parallel = registry.models[0].parallel
    assert parallel is not None and parallel.transport == "ring"
    assert parallel.remotes == (("studio2", "http://studio2:8080/v1", "STUDIO_KEY"),)
    # This machine's budget is charged only its own rank's half.
    _, both_here = _load(tmp_path / "here", make_model, "{ranks: 2}")
    here, split = both_here.models[0].footprint, registry.models[0].footprint
    assert (split.weights, split.kv_cache) == (here.weights // 2, here.kv_cache // 2)


def test_a_parallel_entry_may_batch_up_to_its_max_concurrency(tmp_path, make_model):
    _, registry = _load(tmp_path, make_model, "{ranks: 2}", "    max_concurrency: 4\n")
    spec = registry.models[0]
    assert spec.broken is None and spec.max_concurrency == 4


def test_a_jaccl_gang_over_two_macs_keeps_the_rdma_devices_joining_them(tmp_path, make_model):
    backends = "backends:\n  studio2: {url: 'http://studio2:8080/v1', kind: mlxd}\n"
    _, registry = _load(tmp_path, make_model,
                        "{ranks: [local, studio2], transport: jaccl, rdma_devices: [[null, rdma_en5], [rdma_en3, null]]}",
                        backends)
    parallel = registry.models[0].parallel
    assert parallel is not None and parallel.transport == "jaccl"
    assert parallel.rdma_devices == ((None, "rdma_en5"), ("rdma_en3", None))
