"""The demo registry names a tiny `kind: transcription` and a tiny
`kind: speech` entry, kinds written out, answering to OpenAI's model names."""

from __future__ import annotations

import yaml

from mlxd.cli.demo import _audio_entries
from mlxd.registry.loader import load_registry
from mlxd.registry.resolve import detect_kind, read_model_config


def test_the_demo_names_a_transcription_and_a_speech_entry(tmp_path) -> None:
    lines = _audio_entries()
    entries = yaml.safe_load("\n".join(lines))
    assert {e["name"]: e["kind"] for e in entries} == {"whisper-tiny": "transcription", "soprano-tiny": "speech"}
    registry_file = tmp_path / "models.yaml"
    registry_file.write_text("manager:\n  memory_budget: 2GB\nmodels:\n" + "\n".join(lines) + "\n")
    registry = load_registry(registry_file)
    whisper, soprano = registry.lookup("whisper-1"), registry.lookup("tts-1")
    assert whisper is not None and whisper.name == "whisper-tiny" and whisper.broken is None
    assert soprano is not None and soprano.name == "soprano-tiny" and soprano.broken is None
    # No KV cache to reserve: the weights, then what the first request measures.
    assert whisper.footprint.kv_cache == soprano.footprint.kv_cache == 0
    assert whisper.footprint.weights > 1_000_000 and soprano.footprint.weights > 10_000_000
    assert registry.kind_of(whisper).name == "transcription" and registry.kind_of(soprano).name == "speech"
    # An entry without `kind:` gets the same, from config.json's model_type.
    assert detect_kind(read_model_config(whisper.path)) == "transcription"
    assert detect_kind(read_model_config(soprano.path)) == "speech"
