"""Tiny random BERT-shaped encoders: an embedding model and cross-encoders
(``BertForSequenceClassification``, and ``XLMRobertaForSequenceClassification``
as bge-reranker-v2-m3 is).

Each is a folder like the ones sentence-transformers and transformers ship
(``config.json``, ``model.safetensors`` in transformers' tensor names, a
WordPiece ``tokenizer.json``), so mlx-embeddings loads the
embedding model as it loads all-MiniLM-L6-v2, and sentence-transformers
itself can load both (which is how the reference scores in the tests were
made). The embedding model carries the sentence-transformers files (mean
pooling, normalised); the cross-encoder is a ``BertForSequenceClassification``
with one label.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from pathlib import Path

from mlxd.factory.cache_root import payload_key
from mlxd.factory.build import default_cache_dir
from mlxd.files import build_once

# Bump when the output of a build changes for the same recipe.
ENCODER_FACTORY_VERSION = 3
# The WordPiece vocabulary (after the special tokens), shipped rather than
# trained: the tests hold sentence-transformers' scores of these models, and
# the tokenizers trainer's output changed between 0.23.2 and 0.23.3, so a
# trained vocabulary turned those references stale with every release.
VOCABULARY = Path(__file__).resolve().parent / "vocab" / "wordpiece.txt"

TASKS = ("embedding", "rerank")
ARCHS = ("bert", "xlm-roberta")
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# XLM-R's, at XLM-R's ids: <s> 0, <pad> 1 (its pad_token_id), </s> 2.
XLMR_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


@dataclass(frozen=True)
class EncoderRecipe:
    task: str = "embedding"
    seed: int = 0
    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    intermediate_size: int = 128
    vocab_size: int = 2048
    # The longest input (sentence-transformers' max_seq_length): short, so
    # tests reach it with a sentence or two.
    max_seq_length: int = 128
    arch: str = "bert"

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"unknown task {self.task!r}; choose from {TASKS}")
        if self.arch not in ARCHS:
            raise ValueError(f"unknown arch {self.arch!r}; choose from {ARCHS}")
        if not len(SPECIALS) < self.vocab_size <= len(SPECIALS) + len(_vocabulary()):
            raise ValueError(f"vocab_size {self.vocab_size} is outside the shipped vocabulary's "
                             f"{len(SPECIALS) + 1}..{len(SPECIALS) + len(_vocabulary())}")
        if self.arch == "xlm-roberta" and self.task != "rerank":
            raise ValueError("the factory's XLM-R encoder is a cross-encoder (task rerank)")

    def slug(self) -> str:
        return f"{self.arch}-{self.task}-h{self.hidden_size}-s{self.seed}"

    def payload(self) -> dict[str, object]:
        """What names a build; BERT's leaves ``arch`` out, as before it existed (its folders stay valid)."""
        fields = dataclasses.asdict(self)
        if self.arch == "bert":
            del fields["arch"]
        return fields


def build_encoder(recipe: EncoderRecipe, cache_dir: Path | None = None) -> Path:
    """The folder of the encoder ``recipe`` describes, built once."""
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    payload = {"recipe": recipe.payload(), "factory": ENCODER_FACTORY_VERSION}
    key = payload_key(payload)
    return build_once(cache_dir / f"{recipe.slug()}-{key}", lambda out: _write(recipe, out))


@functools.cache
def _vocabulary() -> tuple[str, ...]:
    return tuple(VOCABULARY.read_text(encoding="utf-8").splitlines())


def _wordpiece(vocab_size: int, xlmr: bool = False) -> object:
    """BERT's tokenizer (lower-cased, WordPiece) over the shipped vocabulary;
    XLM-R's special tokens and pair template when ``xlmr``."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    specials = XLMR_SPECIALS if xlmr else SPECIALS
    words = [*specials, *_vocabulary()[: vocab_size - len(specials)]]
    unk = "<unk>" if xlmr else "[UNK]"
    tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(words)}, unk_token=unk))
    tok.add_special_tokens(specials)
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    if xlmr:
        # RoBERTa's pair template: one token type for both texts.
        bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
        tok.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
            special_tokens=[("<s>", bos), ("</s>", eos)],
        )
        return tok
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return tok


def _layer_shapes(recipe: EncoderRecipe, tok: object) -> dict[str, object]:
    return {
        "hidden_size": recipe.hidden_size,
        "num_hidden_layers": recipe.num_hidden_layers,
        "num_attention_heads": recipe.num_attention_heads,
        "intermediate_size": recipe.intermediate_size,
        "hidden_act": "gelu",
        "vocab_size": tok.get_vocab_size(),  # type: ignore[attr-defined]
    }


def _write(recipe: EncoderRecipe, out: Path) -> None:
    if recipe.arch == "xlm-roberta":
        _write_xlmr(recipe, out)
        return
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_embeddings.models import bert

    tok = _wordpiece(recipe.vocab_size)
    tok.save(str(out / "tokenizer.json"))  # type: ignore[attr-defined]
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "do_lower_case": True,
        "pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
        "mask_token": "[MASK]", "model_max_length": 512,
        # As BERT's own tokenizer: a pair's second text has token type 1.
        "model_input_names": ["input_ids", "token_type_ids", "attention_mask"],
    }, indent=2))
    config = {
        "model_type": "bert",
        "architectures": ["BertModel" if recipe.task == "embedding" else "BertForSequenceClassification"],
        **_layer_shapes(recipe, tok),
        "max_position_embeddings": 512,
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "position_embedding_type": "absolute",
    }
    mx.random.seed(recipe.seed)
    model = bert.Model(bert.ModelArgs.from_dict(config))
    weights = dict(tree_flatten(model.parameters()))
    if recipe.task == "rerank":
        config["id2label"] = {"0": "LABEL_0"}
        config["label2id"] = {"LABEL_0": 0}
        weights = {f"bert.{k}": v for k, v in weights.items()}
        # Large enough that documents' scores spread out (a random head at
        # the default scale gives them all nearly the same score).
        weights["classifier.weight"] = mx.random.normal((1, recipe.hidden_size)) * 0.5
        weights["classifier.bias"] = mx.zeros((1,))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    if recipe.task == "embedding":
        _sentence_transformers_files(out, recipe)
    (out / "mlxd-recipe.json").write_text(json.dumps(dataclasses.asdict(recipe), indent=2))


def _write_xlmr(recipe: EncoderRecipe, out: Path) -> None:
    """An ``XLMRobertaForSequenceClassification``: the encoder under
    ``roberta.``, transformers' head (dense, tanh, out_proj) as ``classifier.``."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_embeddings.models import xlm_roberta

    tok = _wordpiece(recipe.vocab_size, xlmr=True)
    tok.save(str(out / "tokenizer.json"))  # type: ignore[attr-defined]
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "pad_token": "<pad>", "unk_token": "<unk>", "cls_token": "<s>", "sep_token": "</s>",
        "mask_token": "<mask>", "model_max_length": 512,
    }, indent=2))
    config = {
        "model_type": "xlm-roberta",
        "architectures": ["XLMRobertaForSequenceClassification"],
        **_layer_shapes(recipe, tok),
        # Positions start after the padding index, as XLM-R's do.
        "max_position_embeddings": 514,
        "type_vocab_size": 1,
        "layer_norm_eps": 1e-5,
        "bos_token_id": 0, "pad_token_id": 1, "eos_token_id": 2,
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "position_embedding_type": "absolute",
        "id2label": {"0": "LABEL_0"},
        "label2id": {"LABEL_0": 0},
    }
    mx.random.seed(recipe.seed)
    args = xlm_roberta.ModelArgs.from_dict(config)
    args.add_pooling_layer = False
    weights = {f"roberta.{k}": v for k, v in tree_flatten(xlm_roberta.Model(args).parameters())}
    hidden = recipe.hidden_size
    weights["classifier.dense.weight"] = mx.random.normal((hidden, hidden)) / hidden ** 0.5
    weights["classifier.dense.bias"] = mx.zeros((hidden,))
    # Large enough that documents' scores spread out (as the BERT head's).
    weights["classifier.out_proj.weight"] = mx.random.normal((1, hidden)) * 0.5
    weights["classifier.out_proj.bias"] = mx.zeros((1,))
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    (out / "mlxd-recipe.json").write_text(json.dumps(dataclasses.asdict(recipe), indent=2))


def _sentence_transformers_files(out: Path, recipe: EncoderRecipe) -> None:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (out / "modules.json").write_text(json.dumps(modules, indent=2))
    (out / "1_Pooling").mkdir()
    (out / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": recipe.hidden_size, "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
    }, indent=2))
    (out / "2_Normalize").mkdir()
    (out / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": recipe.max_seq_length, "do_lower_case": False}))
