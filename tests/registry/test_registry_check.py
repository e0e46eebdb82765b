"""``mlxd check``'s human summary of a registry."""

from __future__ import annotations

import textwrap

from mlxd.registry.check import describe, pinned_and_preloaded_fit
from mlxd.registry.loader import load_registry_text


def load(tmp_path, make_model, budget: str):
    make_model(tmp_path / "a", weight_bytes=1 << 20)
    make_model(tmp_path / "b", weight_bytes=2 << 20)
    text = f"""\
        manager:
          memory_budget: {budget}
          prefix_cache:
            max_bytes: 8MB
        models:
          - name: alpha
            path: a
            aliases: [first, one]
            pinned: true
          - name: beta
            path: b
            preload: true
            idle_unload_seconds: 60
            kv_bits: 4
          - name: gamma
            path: b
            estimated_memory_gb: 0.01
        """
    return load_registry_text(textwrap.dedent(text), tmp_path / "models.yaml")


def test_describe_lists_each_model_with_its_charge(tmp_path, make_model):
    registry = load(tmp_path, make_model, "100MB")
    text = describe(registry)
    assert "Memory budget: 100.0 MB" in text
    assert "When a model does not fit: wait_then_fail (wait up to 30 s, then fail)" in text
    assert "alpha [text]  aliases: first, one" in text
    assert f"path: {(tmp_path / 'a').resolve()}" in text
    # 1 MB weights + 4 MB KV (llama-like, 4096 tokens) + 8 MB prefix cache.
    assert "charge: 13.0 MB = weights 1.0 MB + KV cache 4.0 MB + prefix cache 8.0 MB" in text
    assert "pinned: yes; idle unload: never (pinned)" in text
    assert "preload: yes; pinned: no; idle unload: after 60 s idle" in text
    assert "KV cache 4-bit" in text
    assert "estimated_memory_gb" in text
    assert "Pinned + preloaded (alpha, beta)" in text
    assert "fit together" in text and "do NOT" not in text
    assert pinned_and_preloaded_fit(registry)


def test_describe_says_when_the_resident_set_does_not_fit(tmp_path, make_model):
    registry = load(tmp_path, make_model, "20MB")
    assert "do NOT fit together" in describe(registry)
    assert not pinned_and_preloaded_fit(registry)


def test_each_kind_s_charge_names_the_parts_it_holds(tmp_path, make_model):
    """An encoder's second part is one forward pass's activations (it was
    shown as "KV"), an audio model holds weights alone, and neither shows a
    prefix cache it never keeps."""
    bert = {"model_type": "bert", "architectures": ["BertModel"], "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 2, "intermediate_size": 128, "max_position_embeddings": 512, "vocab_size": 100}
    make_model(tmp_path / "enc", config=bert, weight_bytes=1 << 20)
    make_model(tmp_path / "ear", config={"model_type": "whisper", "architectures": ["WhisperForConditionalGeneration"]},
               weight_bytes=1 << 20)
    text = describe(load_registry_text(textwrap.dedent("""\
        models:
          - {name: enc, path: enc, kind: embedding}
          - {name: ear, path: ear, kind: transcription}
        """), tmp_path / "models.yaml"))
    charges = [line.strip() for line in text.splitlines() if line.strip().startswith("charge:")]
    assert charges[0].startswith("charge: ") and " = weights 1.0 MB + activations " in charges[0], charges
    assert "KV" not in charges[0] and "prefix cache" not in charges[0]
    assert charges[1] == "charge: 1.0 MB = weights 1.0 MB", charges
