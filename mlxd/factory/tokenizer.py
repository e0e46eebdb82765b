"""A byte-level BPE tokenizer with a ChatML template, as Qwen-style models ship."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from mlxd.factory.trained_tokenizers import trained_once

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# Vision models need these in the vocabulary as single tokens.
VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END, *VISION_TOKENS]

# ChatML. Content may be a string or a list of parts (text / image), so the same
# template serves text and vision models.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% elif part['type'] in ['image', 'image_url'] %}"
    "{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def train_tokenizer(files: list[Path], vocab_size: int) -> Tokenizer:
    return trained_once("chatml-bpe", files, {"vocab_size": vocab_size, "special": SPECIAL_TOKENS},
                        lambda: _train(files, vocab_size))


def _train(files: list[Path], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(f) for f in files], trainer)
    return tok


def write_tokenizer(tok: Tokenizer, out: Path, max_length: int) -> None:
    tok.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": PAD_TOKEN,
        "unk_token": None,
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": max_length,
        "clean_up_tokenization_spaces": False,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": IM_END, "pad_token": PAD_TOKEN}, indent=2)
    )
