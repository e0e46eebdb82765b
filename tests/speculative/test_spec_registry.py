"""``speculative:`` in models.yaml: what each model gets, and every mistake
named by file, line and key."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from mlxd.errors import ConfigError
from mlxd.registry.check import describe
from mlxd.registry.loader import load_registry_text
from registry.conftest import LLAMA_LIKE, make_model_dir

GIB = 1024**3


def _folder(tmp_path: Path, name: str, tokenizer: str = "A", config: dict | None = None,
            weight_bytes: int = 8192) -> Path:
    folder = make_model_dir(tmp_path / name, config=config or LLAMA_LIKE, weight_bytes=weight_bytes)
    (folder / "tokenizer.json").write_text(json.dumps({"model": tokenizer}))
    return folder


def _load(text: str, tmp_path: Path):
    big = _folder(tmp_path, "big")
    small = _folder(tmp_path, "small", weight_bytes=2048)  # a quarter of big: a draft that may pay
    other = _folder(tmp_path, "other", tokenizer="B")
    hybrid = _folder(tmp_path, "hybrid", config={**LLAMA_LIKE, "model_type": "qwen3_next"})
    body = textwrap.dedent(text).format(big=big, small=small, other=other, hybrid=hybrid)
    return load_registry_text("manager:\n  memory_budget: 1GB\n" + body, physical_memory=64 * GIB)


def test_each_method_resolves_and_check_says_what_each_model_gets(tmp_path: Path) -> None:
    registry = _load("""\
        models:
          - name: big
            path: {big}
            speculative: {{method: draft, draft_model: small-alias, tokens: 3}}
          - name: small
            aliases: [small-alias]
            path: {small}
          - name: lookup
            path: {other}
            speculative: {{method: prompt_lookup}}
        """, tmp_path)
    big, small, lookup = (registry.find(n) for n in ("big", "small", "lookup"))
    assert big.speculative is not None and big.speculative.draft_model == "small"
    assert big.speculative.draft_path == small.path and big.speculative.tokens == 3
    # The draft's weights are in the target's charge: they load together.
    assert big.footprint.draft >= small.footprint.weights > 0
    assert big.charge_bytes - big.footprint.draft == small.charge_bytes + big.footprint.weights - small.footprint.weights
    assert lookup.speculative is not None and lookup.speculative.tokens == 4
    text = describe(registry)
    assert "draft with `small`" in text and "+ draft model" in text
    assert "prompt_lookup (n-gram drafts" in text
    assert "speculative decoding: off" in text  # small


BAD = [
    ("unknown method", "speculative: {{method: medusa}}", 4, "models[0].speculative.method", "prompt_lookup"),
    ("draft without a model", "speculative: {{method: draft}}", 4, "models[0].speculative.draft_model",
     "needs `draft_model:`"),
    ("prompt lookup with a model", "speculative: {{method: prompt_lookup, draft_model: small}}", 4,
     "models[0].speculative.draft_model", "is for `method: draft`"),
    ("a draft that is not there", "speculative: {{method: draft, draft_model: tiny}}", 4,
     "models[0].speculative.draft_model", "no model is named `tiny`"),
    ("a draft of another tokenizer", "speculative: {{method: draft, draft_model: other}}", 4,
     "models[0].speculative.draft_model", "another tokenizer"),
    ("itself as its draft", "speculative: {{method: draft, draft_model: big}}", 4,
     "models[0].speculative.draft_model", "cannot draft for itself"),
    ("K out of range", "speculative: {{method: prompt_lookup, tokens: 0}}", 4, "models[0].speculative.tokens",
     "greater than or equal to 1"),
    ("mtp where mlx-lm loads no heads", "speculative: {{method: mtp}}", 4, "models[0].speculative.method",
     "`big` (model_type `llama`) has no multi-token-prediction heads"),
]


@pytest.mark.parametrize(("line_text", "line", "key", "fragment"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_speculative_settings_name_file_line_and_key(
    tmp_path: Path, line_text: str, line: int, key: str, fragment: str
) -> None:
    text = f"""\
        models:
          - name: big
            path: {{big}}
            {line_text}
          - name: small
            path: {{small}}
          - name: other
            path: {{other}}
        """
    with pytest.raises(ConfigError) as caught:
        _load(text, tmp_path)
    # The manager section adds two lines above the models.
    assert caught.value.line == line + 2, caught.value
    assert caught.value.key == key
    assert fragment in str(caught.value)


def test_a_draft_about_the_targets_size_is_said_to_start_off_and_a_small_one_is_not(tmp_path: Path) -> None:
    target = make_model_dir(tmp_path / "target", config=LLAMA_LIKE, weight_bytes=8192)
    tiny = make_model_dir(tmp_path / "tiny", config=LLAMA_LIKE, weight_bytes=1024)
    twin = make_model_dir(tmp_path / "twin", config=LLAMA_LIKE, weight_bytes=8192)
    for folder in (target, tiny, twin):
        (folder / "tokenizer.json").write_text(json.dumps({"model": "A"}))
    registry = load_registry_text(textwrap.dedent(f"""\
        manager:
          memory_budget: 1GB
        models:
          - name: fast
            path: {target}
            speculative: {{method: draft, draft_model: tiny, tokens: 4}}
          - name: slow
            path: {target}
            speculative: {{method: draft, draft_model: twin, tokens: 4}}
          - name: tiny
            path: {tiny}
          - name: twin
            path: {twin}
        """), physical_memory=64 * GIB)
    fast, slow = registry.find("fast"), registry.find("slow")
    assert fast.speculative.draft_ratio == pytest.approx(1024 / 8192) and fast.speculative.cannot_pay is None
    assert fast.footprint.draft >= 1024
    # K + 1 tokens for a pass and K draft steps each as dear as a plain one: 5 / 5.
    assert slow.speculative.best_speedup() == pytest.approx(1.0)
    assert "gains at most 1.00x" in (slow.speculative.cannot_pay or "")
    assert slow.footprint.draft == 0  # never loaded
    text = describe(registry)
    assert text.count("speculative decoding: off: the draft weighs 1.00 of this model") == 1


def test_auto_off_false_speculates_with_a_draft_that_cannot_pay(tmp_path: Path) -> None:
    registry = _load("""\
        models:
          - name: big
            path: {big}
            speculative: {{method: draft, draft_model: twin, auto_off: false}}
          - name: twin
            path: {big}
        """, tmp_path)
    big = registry.find("big")
    assert big.speculative.auto_off is False and big.speculative.cannot_pay is None
    assert big.footprint.draft > 0
    assert "at every step, paying or not (auto_off: false)" in describe(registry)


def test_a_quantised_kv_cache_with_speculation_is_a_config_error(tmp_path: Path) -> None:
    """Speculation runs in the continuous batch, which takes no quantised KV
    cache: accepted, the model decoded without it while `mlxd check` said it
    speculated, and a draft model was loaded and charged for nothing."""
    with pytest.raises(ConfigError) as caught:
        _load("""\
            models:
              - name: big
                path: {big}
                kv_bits: 8
                speculative: {{method: draft, draft_model: small}}
              - name: small
                path: {small}
            """, tmp_path)
    assert (caught.value.line, caught.value.key) == (7, "models[0].speculative")
    assert "kv_bits" in str(caught.value)
