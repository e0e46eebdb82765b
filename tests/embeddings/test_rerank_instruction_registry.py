"""``instruction:`` in models.yaml: taken by an LLM reranker's entry, shown
by ``mlxd check``, applied live on a reload, and refused with file, line and
key on any other entry."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from mlxd.errors import ConfigError
from mlxd.registry.check import describe
from mlxd.registry.diff import diff_registries
from mlxd.registry.loader import load_registry_text
from mlxd.registry.model import RERANK_INSTRUCTION


def registry(tmp_path: Path, body: str, **folders: Path):
    text = "manager:\n  memory_budget: 4GB\nmodels:\n" + textwrap.indent(textwrap.dedent(body).format(**folders), "  ")
    return load_registry_text(text, tmp_path / "models.yaml")


def test_an_llm_reranker_takes_an_instruction_and_check_shows_it(tmp_path, llm_reranker) -> None:
    loaded = registry(tmp_path, """\
        - name: own
          path: {llm}
          kind: rerank
          instruction: Find the code that answers the question
        - name: card
          path: {llm}
          kind: rerank
        """, llm=llm_reranker)
    assert loaded.find("own").instruction == "Find the code that answers the question"
    assert loaded.find("card").instruction is None
    text = describe(loaded)
    assert "instruction: 'Find the code that answers the question' (instruction:)" in text
    assert f"instruction: {RERANK_INSTRUCTION!r} (the model card's default)" in text


def test_a_changed_instruction_applies_without_a_reload(tmp_path, llm_reranker) -> None:
    entry = "- name: own\n  path: {llm}\n  kind: rerank\n"
    before = registry(tmp_path, entry + "  instruction: first task\n", llm=llm_reranker)
    after = registry(tmp_path, entry + "  instruction: second task\n", llm=llm_reranker)
    change = diff_registries(before, after)
    assert change.live == ("own",) and not change.reload


BAD = [
    ("an embedding model", "embed", "embedding", "instruction: anything", "`second` is of kind `embedding`"),
    ("a cross-encoder", "cross", "rerank", "instruction: anything", "is a cross-encoder (BertForSequenceClassification)"),
    ("an empty one", "llm", "rerank", "instruction: '  '", "cannot be empty"),
    ("not a string", "llm", "rerank", "instruction: [a, b]", "string"),
]


@pytest.mark.parametrize(("folder", "kind", "line_text", "fragment"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_misplaced_instruction_names_file_line_and_key(tmp_path, tiny_embedder, tiny_reranker, llm_reranker,
                                                          folder, kind, line_text, fragment) -> None:
    folders = {"embed": tiny_embedder, "cross": tiny_reranker, "llm": llm_reranker}
    with pytest.raises(ConfigError) as caught:
        registry(tmp_path, f"""\
            - name: first
              path: {{llm}}
              kind: rerank
            - name: second
              path: {{{folder}}}
              kind: {kind}
              {line_text}
            """, **folders)
    assert caught.value.line == 10, caught.value
    assert caught.value.key == "models[1].instruction"
    assert fragment in str(caught.value)
    assert "models.yaml" in str(caught.value)
