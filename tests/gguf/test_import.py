"""`mlxd import`: GGUF files written from the factory's tiny models come back
as mlx-lm folders that answer exactly like the model the file holds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter

from mlxd.errors import GGUFError
from mlxd.gguf import import_gguf
from support.daemon import tiny_model
from support.gguf_files import F16, Q4_0, Q4_1, Q8_0, write_gguf

pytestmark = pytest.mark.mlx

PROMPT = [{"role": "user", "content": "The quick brown fox jumps over the lazy dog"}]


def _greedy(folder: Path, max_tokens: int = 24) -> tuple[list[int], str]:
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(folder))
    prompt = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True)
    return prompt, mlx_lm.generate(model, tokenizer, prompt, max_tokens=max_tokens)


@pytest.mark.parametrize("kind", ["qwen", "llama"])
@pytest.mark.parametrize("qtype", [Q4_0, Q4_1, Q8_0], ids=["Q4_0", "Q4_1", "Q8_0"])
def test_quantized_gguf_answers_like_the_model_it_holds(tmp_path, kind, qtype):
    source = tmp_path / "source"
    gguf = write_gguf(tiny_model(kind), tmp_path / "model.gguf", qtype, quantized_source=source)
    imported = import_gguf(gguf, tmp_path / "imported")

    assert _greedy(imported) == _greedy(source)
    config = json.loads((imported / "config.json").read_text())
    assert config["quantization"] == {"group_size": 32, "bits": 8 if qtype == Q8_0 else 4}
    assert config["rope_traditional"] is (kind == "llama")
    assert config["tie_word_embeddings"] is True


def test_quantized_blocks_are_kept_bit_for_bit(tmp_path):
    # Qwen2 has no Q/K permutation, so every array can be compared directly:
    # the packed 4-bit values, scales and offsets are the file's, no floats between.
    source = tmp_path / "source"
    gguf = write_gguf(tiny_model("qwen"), tmp_path / "model.gguf", Q4_1, quantized_source=source)
    imported = mx.load(str(import_gguf(gguf, tmp_path / "imported") / "model.safetensors"))
    expected = mx.load(str(source / "model.safetensors"))
    assert sorted(imported) == sorted(expected)
    for name, value in expected.items():
        assert imported[name].dtype == value.dtype, name
        assert mx.array_equal(imported[name], value), name
    assert imported["model.layers.0.self_attn.q_proj.bias"].shape == (128,)  # qwen2's attention biases


def test_the_rebuilt_tokenizer_gives_the_same_ids(tmp_path):
    from transformers import AutoTokenizer

    model = tiny_model("llama")
    imported = import_gguf(write_gguf(model, tmp_path / "m.gguf", Q8_0), tmp_path / "imported")
    text = "Grüße, 世界! <|im_start|>user\nprint(42)  tabs\tand ünïcödé 🎉<|im_end|>"
    ours, theirs = AutoTokenizer.from_pretrained(imported), AutoTokenizer.from_pretrained(model)
    assert ours.encode(text) == theirs.encode(text)
    assert ours.decode(ours.encode(text)) == text
    assert ours.eos_token == "<|im_end|>"
    assert ours.chat_template == theirs.chat_template


def test_float_weights_are_kept_or_requantized_when_asked(tmp_path):
    gguf = write_gguf(tiny_model("qwen"), tmp_path / "m.gguf", F16)
    plain = import_gguf(gguf, tmp_path / "plain")
    assert "quantization" not in json.loads((plain / "config.json").read_text())
    assert mx.load(str(plain / "model.safetensors"))["model.layers.0.mlp.up_proj.weight"].dtype == mx.float16

    requantized = import_gguf(gguf, tmp_path / "q4", quantize_bits=4)
    assert json.loads((requantized / "config.json").read_text())["quantization"] == {"group_size": 32, "bits": 4}
    prompt, text = _greedy(requantized, max_tokens=8)
    assert text  # mlx-lm loads the quantized layers and decodes


def _last_logits(folder: Path) -> mx.array:
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(folder))
    prompt = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True)
    return model(mx.array([prompt]))[0, -1].astype(mx.float32)


@pytest.mark.parametrize("kind, qtype", [("llama", Q4_1), ("qwen", Q8_0), ("qwen", Q4_0)], ids=["llama-Q4_1", "qwen-Q8_0", "qwen-Q4_0"])
def test_a_float32_import_answers_like_the_quantized_one_with_no_quantized_tensor_left(tmp_path, kind, qtype):
    gguf = write_gguf(tiny_model(kind), tmp_path / "model.gguf", qtype)
    quantized = import_gguf(gguf, tmp_path / "quantized")
    floats = import_gguf(gguf, tmp_path / "float32", dtype="float32")

    assert _greedy(floats) == _greedy(quantized)
    expected, got = _last_logits(quantized), _last_logits(floats)
    # Equal here; a BLAS that sums in another order may differ in the last bits.
    assert mx.abs(got - expected).max().item() <= 1e-4 * mx.abs(expected).max().item()
    assert mx.argmax(got).item() == mx.argmax(expected).item()

    tensors = mx.load(str(floats / "model.safetensors"))
    assert not [n for n in tensors if n.endswith((".scales", ".biases"))]
    assert {v.dtype for v in tensors.values()} == {mx.float32}
    q_proj = tensors["model.layers.0.self_attn.q_proj.weight"]
    assert q_proj.shape == (128, 128)  # unpacked: out x in, not out x in * bits / 32
    config = json.loads((floats / "config.json").read_text())
    assert "quantization" not in config and config["torch_dtype"] == "float32"


def test_a_bfloat16_import_casts_every_float_and_still_decodes(tmp_path):
    gguf = write_gguf(tiny_model("qwen"), tmp_path / "model.gguf", Q4_1)
    folder = import_gguf(gguf, tmp_path / "bf16", dtype="bf16")
    tensors = mx.load(str(folder / "model.safetensors"))
    assert {v.dtype for v in tensors.values()} == {mx.bfloat16}
    assert not [n for n in tensors if n.endswith(".scales")]
    assert json.loads((folder / "config.json").read_text())["torch_dtype"] == "bfloat16"
    _, text = _greedy(folder, max_tokens=8)
    assert text


def test_quantizing_and_dequantizing_at_once_is_refused_before_any_work(tmp_path):
    gguf = write_gguf(tiny_model("qwen"), tmp_path / "m.gguf", F16)
    with pytest.raises(GGUFError, match="--quantize 4 cannot be combined with --dtype float32"):
        import_gguf(gguf, tmp_path / "out", quantize_bits=4, dtype="float32")
    with pytest.raises(GGUFError, match="unknown dtype 'int8'; choose from keep, float32"):
        import_gguf(gguf, tmp_path / "out", dtype="int8")
    assert not (tmp_path / "out").exists()


def test_a_sentencepiece_vocabulary_is_rebuilt_with_byte_fallback():
    from mlxd.gguf.tokenizer import build_tokenizer

    pieces = ["\u2581", "h", "e", "l", "o", "w", "r", "d", "\u2581h", "\u2581he", "ll", "\u2581hell",
              "\u2581hello", "\u2581w", "\u2581wo", "\u2581wor", "\u2581worl", "\u2581world"]
    tokens = ["<unk>", "<s>", "</s>", *[f"<0x{b:02X}>" for b in range(256)], *pieces]
    types = [2, 3, 3, *[6] * 256, *[1] * len(pieces)]
    built = build_tokenizer({
        "general.architecture": "llama", "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [-float(i) for i in range(len(tokens))], "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2, "tokenizer.ggml.unknown_token_id": 0,
    })
    tok, ids = built.tokenizer, {t: i for i, t in enumerate(tokens)}
    assert tok.encode("hello world").ids == [1, ids["\u2581hello"], ids["\u2581world"]]
    # ü is not a piece: its two UTF-8 bytes stand in for it.
    assert tok.encode("hello ü").ids == [1, ids["\u2581hello"], ids["\u2581"], ids["<0xC3>"], ids["<0xBC>"]]
    for text in ("hello world", "hello ü", "world hello"):
        assert tok.decode(tok.encode(text).ids, skip_special_tokens=True) == text
    assert (built.eos_token_ids, built.bos_token_id, built.config["add_bos_token"]) == ([2], 1, True)


def _minimal_gguf(path: Path, arch: str = "llama", *, tokenizer: str = "gpt2",
                  tensor_type: GGMLQuantizationType | None = None) -> Path:
    writer = GGUFWriter(str(path), arch)
    for key, value in (("embedding_length", 64), ("block_count", 1), ("feed_forward_length", 64),
                       ("context_length", 128)):
        writer.add_uint32(f"{arch}.{key}", value)
    writer.add_uint32(f"{arch}.attention.head_count", 2)
    writer.add_tokenizer_model(tokenizer)
    writer.add_token_list(["a", "b"])
    writer.add_token_merges(["a b"])
    writer.add_eos_token_id(1)
    if tensor_type is None:
        writer.add_tensor("token_embd.weight", np.zeros((2, 64), dtype=np.float32))
    else:  # Q8_1: 32 weights in 40 bytes; neither MLX nor gguf-py decodes it
        writer.add_tensor("token_embd.weight", np.zeros((2, 2 * 40), dtype=np.uint8), raw_dtype=tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _written(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda p: _written(p, os.urandom(4096)), "is not a GGUF file"),
        (lambda p: _written(p, b"GGUF\x03\0\0\0" + os.urandom(4096)), "is corrupt or truncated"),
        (lambda p: _minimal_gguf(p, "mamba"), "GGUF architecture `mamba` is not supported"),
        (lambda p: _minimal_gguf(p, tokenizer="rwkv"), "GGUF tokenizer model `rwkv` is not supported"),
        (lambda p: _minimal_gguf(p, tensor_type=GGMLQuantizationType.Q8_1), "has GGUF type Q8_1"),
    ],
    ids=["not-gguf", "corrupt", "architecture", "tokenizer", "tensor-type"],
)
def test_bad_files_are_named_errors_and_leave_nothing_behind(tmp_path, make, message):
    bad = make(tmp_path / "bad.gguf")
    with pytest.raises(GGUFError, match=message.replace("(", r"\(").replace(")", r"\)")):
        import_gguf(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] in ([], [".out.lock"])


def test_a_truncated_download_is_reported(tmp_path):
    gguf = write_gguf(tiny_model("qwen"), tmp_path / "m.gguf", Q8_0)
    data = gguf.read_bytes()
    short = tmp_path / "short.gguf"
    short.write_bytes(data[: len(data) // 2])
    with pytest.raises(GGUFError, match="corrupt or truncated"):
        import_gguf(short, tmp_path / "out")


def _mlxd(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mlxd", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_cli_imports_into_a_named_folder_and_says_how_to_serve_it(tmp_path):
    gguf = write_gguf(tiny_model("qwen"), tmp_path / "Tiny-Qwen.Q8_0.gguf", Q8_0)
    done = _mlxd("import", str(gguf), "--name", "tiny", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "tiny" / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["Tiny-Qwen.Q8_0.gguf", "tiny"]  # nothing else left
    assert "- name: tiny" in done.stdout and f"path: {tmp_path / 'tiny'}" in done.stdout

    again = _mlxd("import", str(gguf), "--name", "tiny", cwd=tmp_path)
    assert again.returncode == 2
    assert again.stderr.strip().splitlines() == [f"mlxd: error: {tmp_path / 'tiny'} already exists and is not an empty folder"]


def test_cli_imports_as_float32_and_refuses_a_contradiction(tmp_path):
    gguf = write_gguf(tiny_model("qwen"), tmp_path / "Tiny.Q4_1.gguf", Q4_1)
    done = _mlxd("import", str(gguf), "f32", "--dtype", "float32", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "quantization" not in json.loads((tmp_path / "f32" / "config.json").read_text())

    both = _mlxd("import", str(gguf), "both", "--dtype", "float32", "--quantize", "4", cwd=tmp_path)
    assert both.returncode == 2
    assert both.stderr.strip().splitlines() == [
        "mlxd: error: --quantize 4 cannot be combined with --dtype float32, which dequantizes every matrix: use one or the other"
    ]
    assert not (tmp_path / "both").exists()


def test_cli_error_is_one_line_with_status_2(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model")
    done = _mlxd("import", str(bad), str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"mlxd: error: {bad} is not a GGUF file (it does not start with 'GGUF')"]
