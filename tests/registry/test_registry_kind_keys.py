"""A key the entry's kind does not read is an error at its line, naming the
key and the kind (accepted, it would do nothing while `mlxd check` showed it)."""

from __future__ import annotations

import pytest

from mlxd.errors import ConfigError
from mlxd.registry.loader import load_registry_text

GIB = 1024**3
BERT = {"model_type": "bert", "architectures": ["BertModel"], "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 2, "intermediate_size": 128, "max_position_embeddings": 512}
FOLDERS = {
    "embedding": BERT,
    "rerank": {**BERT, "architectures": ["BertForSequenceClassification"]},
    "transcription": {"model_type": "whisper", "d_model": 64},
    "speech": {"model_type": "soprano", "hidden_size": 64},
}


def _load(tmp_path, make_model, kind: str, line: str):
    folder = make_model(tmp_path / kind, config=FOLDERS[kind])
    text = f"models:\n  - name: m\n    path: {folder}\n    kind: {kind}\n    {line}\n"
    return load_registry_text(text, tmp_path / "models.yaml", physical_memory=16 * GIB)


@pytest.mark.parametrize("kind", sorted(FOLDERS))
@pytest.mark.parametrize("line", [
    "max_context: 128", "kv_bits: 4", "defaults: {temperature: 0.5}", "prefix_cache: {max_bytes: 1MB}",
    "tool_parser: json_tools", "reasoning_parser: think", "chat_template_kwargs: {enable_thinking: false}",
    "local_image_dir: /tmp", "allow_remote_images: true",
])
def test_a_generation_key_on_an_encoder_or_audio_entry_is_refused_at_its_line(tmp_path, make_model, kind, line):
    key = line.split(":")[0]
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, make_model, kind, line)
    error = caught.value
    assert (error.line, error.key) == (5, f"models[0].{key}")
    assert f"`{key}` is for models that generate text" in error.detail and f"a{'n' * (kind == 'embedding')} {kind} model" in error.detail


@pytest.mark.parametrize("kind", sorted(FOLDERS))
def test_what_says_nothing_stays_accepted(tmp_path, make_model, kind):
    # null, an empty mapping and a default say nothing: not refused.
    spec = _load(tmp_path, make_model, kind, "defaults: {}\n    kv_bits: null\n    allow_remote_images: false").models[0]
    assert spec.kind == kind


def test_matryoshka_is_for_embedding_entries_only(tmp_path, make_model):
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, make_model, "rerank", "matryoshka: true")
    assert caught.value.key == "models[0].matryoshka"
    assert "is for `kind: embedding` entries; `m` is a rerank model" in caught.value.detail
    assert _load(tmp_path, make_model, "embedding", "matryoshka: true").models[0].matryoshka is True


@pytest.mark.parametrize("written, meant", [("chat", "text"), ("embeddings", "embedding"), ("Rerank", "rerank"),
                                            ("tts", "speech"), ("stt", "transcription")])
def test_an_unknown_kind_suggests_the_one_meant(tmp_path, make_model, written, meant):
    folder = make_model(tmp_path / "m")
    with pytest.raises(ConfigError) as caught:
        load_registry_text(f"models:\n  - name: m\n    path: {folder}\n    kind: {written}\n", tmp_path / "models.yaml")
    assert (caught.value.line, caught.value.key) == (4, "models[0].kind")
    assert caught.value.detail.endswith(f"got {written!r}; did you mean `{meant}`?")


@pytest.mark.parametrize("kind", ["embedding", "rerank", "transcription", "speech"])
def test_a_generation_key_on_a_remote_entry_of_another_kind_is_refused(tmp_path, kind):
    text = ("backends:\n  studio:\n    url: http://studio.local:8080/v1\n"
            f"models:\n  - name: far\n    backend: studio\n    kind: {kind}\n    defaults: {{temperature: 0.5}}\n")
    with pytest.raises(ConfigError) as caught:
        load_registry_text(text, tmp_path / "models.yaml")
    assert (caught.value.line, caught.value.key) == (8, "models[0].defaults")
    assert f"`far` is {'an' if kind == 'embedding' else 'a'} {kind} model" in caught.value.detail


@pytest.mark.parametrize("kind, folder, holds", [
    ("transcription", {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 64},
     "a text model (Qwen2ForCausalLM), model_type `qwen2`"),
    ("speech", FOLDERS["transcription"], "a transcription model, model_type `whisper`"),
    ("transcription", BERT, "an embedding model, model_type `bert`"),
])
def test_an_audio_kind_on_a_folder_of_another_model_is_a_located_problem(tmp_path, make_model, kind, folder, holds):
    # Before, `mlxd check` passed and the first request's load failed with
    # "could not be loaded (ValueError); see the daemon log".
    path = make_model(tmp_path / "m", config=folder)
    registry = load_registry_text(f"models:\n  - name: m\n    path: {path}\n    kind: {kind}\n",
                                  tmp_path / "models.yaml", physical_memory=16 * GIB)
    (problem,) = registry.problems
    assert (problem.line, problem.key) == (4, "models[0].kind")
    assert f"`kind: {kind}` names an mlx-audio model, but this folder holds {holds}" in problem.detail
    assert registry.models[0].broken == problem.detail
