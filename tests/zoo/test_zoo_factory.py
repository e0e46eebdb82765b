"""Every zoo family builds into a folder mlx-lm loads as the real family:
its own template, its tool parser and think markers detected, its cache types."""

from __future__ import annotations

import json

import pytest
from zoo.zoo_support import CHAT, TEXT_FAMILIES, VISION_FAMILIES, family, zoo_model

from mlxd.factory.zoo_files import template_text
from mlxd.tools import formats
from mlxd.tools.fallback import renders_tools

pytestmark = pytest.mark.mlx


@pytest.mark.parametrize("name", TEXT_FAMILIES)
def test_mlx_lm_loads_the_family_with_its_template_parser_markers_and_caches(name, reference):
    from mlx_lm.models.cache import make_prompt_cache

    row = family(name)
    model, tokenizer = reference.loaded(name)
    assert type(model).__module__ == f"mlx_lm.models.{row.arch}"
    assert tokenizer.chat_template == template_text(row)
    parser = tokenizer.tool_parser.__module__.rsplit(".", 1)[-1] if tokenizer.tool_parser else None
    assert parser == row.tool_parser
    markers = (tokenizer.think_start, tokenizer.think_end) if tokenizer.has_thinking else None
    assert markers == row.think
    assert sorted({type(c).__name__ for c in make_prompt_cache(model)}) == sorted(row.caches)
    # Every special token is one id, so the template's markers reach the model whole.
    for token in (*row.control, *row.markup):
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1, token
    text = reference.text(name, CHAT)
    # Varied text, not an echo of one token: the stop-string and streaming paths rely on it.
    assert len(set(text)) > 4, text


@pytest.mark.parametrize("name", TEXT_FAMILIES)
def test_mlxd_picks_the_tool_format_mlx_lm_picks(name, reference):
    path = zoo_model(name)
    _, tokenizer = reference.loaded(name)
    fmt = formats.resolve(tokenizer)
    # mlx-lm has no parser for gpt-oss's harmony calls; mlxd parses them itself (mlxd.tools.harmony).
    expected = formats.HARMONY if name == "gpt_oss" else family(name).tool_parser
    if expected is None and not renders_tools(tokenizer.chat_template):
        # A template with no place for tools: mlxd writes them into the prompt (docs/tools.md).
        expected = formats.DEFAULT
    assert (fmt.name if fmt else None) == expected
    # `mlxd check` reads the same from the folder without loading it.
    assert formats.resolve_from_files(path).name == expected


def test_a_build_is_cached_by_content(tmp_path):
    from mlxd.factory.zoo_build import build_family

    first = build_family("qwen3", cache_dir=tmp_path)
    mtime = (first / "model.safetensors").stat().st_mtime_ns
    assert build_family("qwen3", cache_dir=tmp_path) == first
    assert (first / "model.safetensors").stat().st_mtime_ns == mtime
    assert json.loads((first / "config.json").read_text())["model_type"] == "qwen3"


def test_an_unknown_family_names_the_known_ones():
    from mlxd.factory.zoo_build import build_family

    with pytest.raises(ValueError, match="qwen3_next"):
        build_family("nope")


@pytest.mark.parametrize("name", VISION_FAMILIES)
def test_mlx_vlm_loads_the_vision_family_and_the_image_moves_the_answer(name, reference):
    from mlx_vlm.models.cache import make_prompt_cache
    from vision.vision_support import PROMPT, noise_image, solid_image

    row = family(name)
    model, processor = reference.loaded(name)
    assert type(model).__module__ == f"mlx_vlm.models.{row.arch}.{row.arch}"
    assert processor.tokenizer.chat_template == template_text(row)
    assert sorted({type(c).__name__ for c in make_prompt_cache(model.language_model)}) == sorted(row.caches)
    chat = [{"role": "user", "content": [{"type": "text", "text": PROMPT}, {"type": "image"}]}]
    answers = [reference.vision(name, chat, [image]) for image in (noise_image(), solid_image())]
    assert answers[0] != answers[1]
    assert all(len(set(a)) > 4 for a in answers), answers
