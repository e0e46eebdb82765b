"""Tiny random speech models, made offline, that mlx-audio loads as it loads real ones.

- A Whisper-shaped speech-to-text model (``whisper``): mlx-audio's own
  ``stt.models.whisper.Model`` with random weights, in mlx-audio's tensor
  names, and the files ``WhisperProcessor`` reads (``tokenizer.json``,
  ``tokenizer_config.json``, ``preprocessor_config.json``). Its vocabulary
  is laid out as Whisper's (51,865 ids: text, ``<|endoftext|>``, the start
  and 99 language tokens, the task tokens, 1,501 timestamps), because
  mlx-audio's decoder finds every special token by name and reads "text
  below ``<|endoftext|>``, timestamps from ``<|0.00|>``" from the ids, and
  treats a model as multilingual (language and task tokens, so translation
  differs from transcription) only from 51,865 ids on.
- A Soprano text-to-speech model (``soprano``): mlx-audio's
  ``tts.models.soprano`` (a Qwen3 language model whose hidden states a
  Vocos decoder turns into 32 kHz audio). Soprano is the one mlx-audio TTS
  architecture whose whole text front-end runs offline with what is
  installed: its text cleaning is plain Python and its tokenizer is the
  folder's ``tokenizer.json``. Kokoro and Kitten need misaki / phonemizer
  with espeak-ng, and most others fetch a separate codec from the Hub.
  Its decoder's dimensions are fixed by mlx-audio (8 layers of 512, ~14 M
  parameters), not read from config.json, so this "tiny" model is ~55 MB.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxd.factory.cache_root import default_cache_dir, payload_key
from mlxd.factory.corpus import corpus_digest, stdlib_files
from mlxd.files import build_once

# Bump when the output of a build changes for the same recipe.
AUDIO_FACTORY_VERSION = 1

# Whisper's vocabulary layout (openai/whisper tokenizer, multilingual).
WHISPER_TEXT_TOKENS = 50257
WHISPER_LANGUAGES = 99
TIMESTAMPS = 1501  # <|0.00|> ... <|30.00|>, 20 ms apart
SOPRANO_SPECIALS = ["[STOP]", "[TEXT]", "[START]"]


@dataclass(frozen=True)
class WhisperRecipe:
    seed: int = 0
    n_state: int = 32
    n_head: int = 2
    n_layer: int = 1
    # Whisper's 30 s window: 3,000 mel frames, 1,500 after the encoder's stride.
    n_audio_ctx: int = 1500
    n_mels: int = 80
    # Short: a window decodes at most n_text_ctx // 2 tokens.
    n_text_ctx: int = 32
    bpe_vocab: int = 2000
    corpus_bytes: int = 1_000_000

    def slug(self) -> str:
        return f"whisper-h{self.n_state}-s{self.seed}"


@dataclass(frozen=True)
class SopranoRecipe:
    seed: int = 0
    hidden_size: int = 32
    num_hidden_layers: int = 1
    vocab_size: int = 512
    # The [STOP] token's weight on the hidden state's constant component: a
    # random model then ends a sentence after ~10-100 audio tokens (0.6-6 s),
    # as a trained one does, instead of running to max_tokens (32 s).
    stop_weight: float = 0.2
    corpus_bytes: int = 500_000

    def slug(self) -> str:
        return f"soprano-h{self.hidden_size}-s{self.seed}"


def _key(recipe: Any, files: list[Path]) -> str:
    payload = {"recipe": dataclasses.asdict(recipe), "corpus": corpus_digest(files),
               "python": list(sys.version_info[:2]), "factory": AUDIO_FACTORY_VERSION}
    return payload_key(payload)


def build_whisper(recipe: WhisperRecipe = WhisperRecipe(), cache_dir: Path | None = None) -> Path:
    """The folder of a tiny random Whisper, built once."""
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    files = stdlib_files(recipe.corpus_bytes)
    target = cache_dir / f"{recipe.slug()}-{_key(recipe, files)}"
    return build_once(target, lambda out: _write_whisper(recipe, files, out))


def build_soprano(recipe: SopranoRecipe = SopranoRecipe(), cache_dir: Path | None = None) -> Path:
    """The folder of a tiny random Soprano TTS model, built once."""
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    files = stdlib_files(recipe.corpus_bytes)
    target = cache_dir / f"{recipe.slug()}-{_key(recipe, files)}"
    return build_once(target, lambda out: _write_soprano(recipe, files, out))


def _byte_bpe(files: list[Path], vocab_size: int, specials: list[str]) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train([str(f) for f in files], trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    return tok


def whisper_specials() -> list[str]:
    """Whisper's special tokens in its id order, from <|endoftext|> on."""
    from mlx_audio.stt.models.whisper.tokenizer import LANGUAGES

    languages = [f"<|{code}|>" for code in list(LANGUAGES)[:WHISPER_LANGUAGES]]
    tasks = ["<|translate|>", "<|transcribe|>", "<|startoflm|>", "<|startofprev|>", "<|nospeech|>",
             "<|notimestamps|>"]
    stamps = [f"<|{i * 0.02:.2f}|>" for i in range(TIMESTAMPS)]
    return ["<|endoftext|>", "<|startoftranscript|>", *languages, *tasks, *stamps]


def _whisper_tokenizer(recipe: WhisperRecipe, files: list[Path]) -> Any:
    """A byte-level BPE whose text part is padded to Whisper's 50,257 ids
    (the padding ids are never produced by encoding), then the specials."""
    from tokenizers import AddedToken, Tokenizer

    trained = json.loads(_byte_bpe(files, recipe.bpe_vocab, []).to_str())
    vocab = trained["model"]["vocab"]
    filler = len(vocab)
    while len(vocab) < WHISPER_TEXT_TOKENS:
        vocab[f"\u0120w{filler}"] = len(vocab)
        filler += 1
    tok = Tokenizer.from_str(json.dumps(trained))
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in whisper_specials()])
    return tok


def _write_whisper(recipe: WhisperRecipe, files: list[Path], out: Path) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_audio.stt.models.whisper.whisper import Model, ModelDimensions

    tok = _whisper_tokenizer(recipe, files)
    tok.save(str(out / "tokenizer.json"))
    eot = "<|endoftext|>"
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "WhisperTokenizer", "bos_token": eot, "eos_token": eot, "unk_token": eot,
        "pad_token": eot, "model_max_length": recipe.n_text_ctx, "errors": "replace",
        "clean_up_tokenization_spaces": False}, indent=2))
    (out / "preprocessor_config.json").write_text(json.dumps({
        "feature_extractor_type": "WhisperFeatureExtractor", "processor_class": "WhisperProcessor",
        "feature_size": recipe.n_mels, "sampling_rate": 16000, "hop_length": 160, "chunk_length": 30,
        "n_fft": 400, "n_samples": 480000, "nb_max_frames": 3000, "padding_side": "right",
        "padding_value": 0.0, "return_attention_mask": False}, indent=2))
    dims = {"n_mels": recipe.n_mels, "n_audio_ctx": recipe.n_audio_ctx, "n_audio_state": recipe.n_state,
            "n_audio_head": recipe.n_head, "n_audio_layer": recipe.n_layer, "n_vocab": tok.get_vocab_size(),
            "n_text_ctx": recipe.n_text_ctx, "n_text_state": recipe.n_state, "n_text_head": recipe.n_head,
            "n_text_layer": recipe.n_layer}
    mx.random.seed(recipe.seed)
    model = Model(ModelDimensions(**dims), dtype=mx.float32)
    weights = dict(tree_flatten(model.parameters()))
    # The output layer is the token embedding. Rows of zeros give the
    # padding, special and timestamp ids a logit of 0 at every step, and the
    # trained text rows, scaled up, outscore them: greedy decoding then
    # writes varied text and ends windows with <|endoftext|> as a trained
    # model does. (At the default scale the 1,501 timestamps together
    # outweigh every text token, and mlx-audio's timestamp rule then masks
    # every id: the decoder reads NaN and writes "!" forever.)
    emb = weights["decoder.token_embedding.weight"] * 4.0
    keep = mx.arange(emb.shape[0])[:, None] < recipe.bpe_vocab
    eot_row = mx.arange(emb.shape[0])[:, None] == WHISPER_TEXT_TOKENS
    weights["decoder.token_embedding.weight"] = mx.where(keep | eot_row, emb, 0.0)
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    (out / "config.json").write_text(json.dumps({"model_type": "whisper", **dims}, indent=2))
    (out / "mlxd-recipe.json").write_text(json.dumps(dataclasses.asdict(recipe), indent=2))


def _write_soprano(recipe: SopranoRecipe, files: list[Path], out: Path) -> None:
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_audio.tts.models.soprano import Model, ModelConfig

    tok = _byte_bpe(files, recipe.vocab_size, SOPRANO_SPECIALS)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "[STOP]", "eos_token": "[STOP]",
        "model_max_length": 1024, "clean_up_tokenization_spaces": False}, indent=2))
    config = {
        "model_type": "soprano", "hidden_size": recipe.hidden_size,
        "num_hidden_layers": recipe.num_hidden_layers, "intermediate_size": recipe.hidden_size * 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": recipe.hidden_size // 2,
        "rms_norm_eps": 1e-6, "vocab_size": tok.get_vocab_size(), "max_position_embeddings": 1024,
        "rope_theta": 10000.0, "tie_word_embeddings": False, "sample_rate": 32000,
    }
    mx.random.seed(recipe.seed)
    model = Model(ModelConfig.from_dict({**config, "model_path": str(out)}))
    weights = dict(tree_flatten(model.parameters()))
    # A constant component in every token's embedding, which the residual
    # stream carries to the last hidden state; [STOP]'s output row reads it.
    emb = weights["language_model.embed_tokens.weight"]
    first = mx.arange(emb.shape[1])[None, :] == 0
    weights["language_model.embed_tokens.weight"] = mx.where(first, 3.0, emb)
    head = weights["language_model.lm_head.weight"]
    stop = tok.token_to_id("[STOP]")
    at = (mx.arange(head.shape[0])[:, None] == stop) & first
    weights["language_model.lm_head.weight"] = mx.where(at, recipe.stop_weight, head)
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "mlxd-recipe.json").write_text(json.dumps(dataclasses.asdict(recipe), indent=2))
