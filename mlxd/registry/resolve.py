"""Where a model's files are: a local folder, or a Hugging Face repo id.

Repo ids are looked up in the local Hugging Face cache only. Downloading is
opt-in per model (``allow_download: true``) and goes through a downloader the
caller passes in, so nothing here reaches the network on its own.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mlxd.errors import ConfigError
from mlxd.registry.kinds import a_model_of

logger = logging.getLogger(__name__)

# ``org/name`` as the Hub spells it: no leading dot or slash, exactly one slash.
_REPO_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")

Downloader = Callable[[str, Path], Path]


def hf_hub_cache(env: Mapping[str, str] | None = None) -> Path:
    """The Hub cache folder, by the same rules as ``huggingface_hub``."""
    env = os.environ if env is None else env
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if env.get(key):
            return Path(env[key]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    xdg = env.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def looks_like_repo_id(source: str) -> bool:
    return bool(_REPO_ID_RE.match(source)) and ".." not in source


def find_in_hf_cache(repo_id: str, cache_dir: Path) -> Path | None:
    """The snapshot folder of ``repo_id`` in ``cache_dir``, or None.

    ``refs/main`` names the snapshot ``from_pretrained`` would use. Without it
    (a download pinned to a revision), the most recently written snapshot wins.
    """
    repo_dir = cache_dir / ("models--" + repo_id.replace("/", "--"))
    snapshots = repo_dir / "snapshots"
    if not snapshots.is_dir():
        return None
    ref = repo_dir / "refs" / "main"
    if ref.is_file():
        commit = ref.read_text().strip()
        if (snapshots / commit).is_dir():
            return snapshots / commit
    candidates = [p for p in snapshots.iterdir() if p.is_dir()]
    if not candidates:
        return None
    newest = max(candidates, key=lambda p: p.stat().st_mtime)
    if len(candidates) > 1:
        logger.info(
            "%s: no refs/main in the Hugging Face cache; using snapshot %s", repo_id, newest.name
        )
    return newest


def resolve_model_dir(
    source: str,
    *,
    base_dir: Path,
    allow_download: bool = False,
    env: Mapping[str, str] | None = None,
    downloader: Downloader | None = None,
    gguf_cache: Path | None = None,
) -> Path:
    """The folder holding the model ``source`` names, checked to hold a config.json.

    A source is a local path (absolute, ``~``-relative, or relative to
    ``base_dir``, the registry file's folder) when that path exists or does not
    look like ``org/name``; otherwise a Hugging Face repo id. A ``.gguf`` file
    is converted once into ``gguf_cache`` (mlxd's cache folder) and that
    folder is returned.
    """
    local = Path(source).expanduser()
    if not local.is_absolute():
        local = base_dir / local
    if local.exists() or not looks_like_repo_id(source):
        if not local.exists():
            raise ConfigError(f"model folder {local} does not exist")
        if local.is_file() and local.suffix == ".gguf" and gguf_cache is not None:
            from mlxd.gguf.cache import converted_dir

            return _checked_model_dir(converted_dir(local, gguf_cache))
        if not local.is_dir():
            raise ConfigError(f"{local} is a file; the path must be a model folder or a .gguf file")
        return _checked_model_dir(local.resolve())

    cache_dir = hf_hub_cache(env)
    snapshot = find_in_hf_cache(source, cache_dir)
    if snapshot is not None:
        return _checked_model_dir(snapshot, repo_id=source)
    if not allow_download:
        raise ConfigError(
            f"`{source}` is not a folder (looked for {local}) and is not in the local "
            f"Hugging Face cache ({cache_dir}); download it with "
            f"`huggingface-cli download {source}` or set allow_download: true"
        )
    fetch = downloader or download_from_hub
    return _checked_model_dir(fetch(source, cache_dir), repo_id=source)


def _checked_model_dir(folder: Path, repo_id: str | None = None) -> Path:
    if not (folder / "config.json").is_file():
        what = f"the cached snapshot of `{repo_id}` ({folder})" if repo_id else f"folder {folder}"
        raise ConfigError(f"{what} has no config.json; it is not a model folder")
    return folder


def read_model_config(model_dir: Path) -> dict[str, Any]:
    """The model's config.json as a dict."""
    path = model_dir / "config.json"
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} does not hold a JSON object")
    return data


def detect_kind(config_json: Mapping[str, Any], model_dir: Path | None = None) -> str:
    """``vision`` when the model has a vision tower (mlx-vlm), ``transcription``
    or ``speech`` for mlx-audio's model types, ``rerank`` for a BERT/XLM-R
    sequence classifier (a cross-encoder), ``embedding`` for an encoder
    (``BertModel``, ...) or a sentence-transformers folder, else ``text``."""
    if "vision_config" in config_json:
        return "vision"
    if config_json.get("model_type") in _SPEECH_TO_TEXT:
        return "transcription"
    if config_json.get("model_type") in _TEXT_TO_SPEECH:
        return "speech"
    architectures = [str(a) for a in config_json.get("architectures") or ()]
    if any(a in _CROSS_ENCODERS for a in architectures):
        return "rerank"
    if any(a in _ENCODERS for a in architectures):
        return "embedding"
    if model_dir is not None and (model_dir / "modules.json").is_file():
        return "embedding"
    return "text"


def audio_kind_problem(kind: str, config_json: Mapping[str, Any], model_dir: Path | None = None) -> str | None:
    """Why a folder cannot be the audio model ``kind`` (transcription or
    speech) declares, when its config.json says so plainly: another kind it
    is detected as, or a causal language model (``*ForCausalLM``). mlx-audio
    reads more model types than detect_kind knows, so an unknown type passes."""
    if kind not in ("transcription", "speech"):
        return None
    detected = detect_kind(config_json, model_dir)
    architectures = [str(a) for a in config_json.get("architectures") or ()]
    text_model = detected == "text" and bool(architectures) and all(a.endswith("ForCausalLM") for a in architectures)
    if detected in ("text", kind) and not text_model:
        return None
    what = a_model_of(detected) + (f" ({', '.join(architectures)})" if text_model else "")
    model_type = config_json.get("model_type") or "unknown"
    return (f"`kind: {kind}` names an mlx-audio model, but this folder holds {what}, model_type `{model_type}`; "
            "fix `kind:` (or leave it out to detect it) or `path:`")


def is_llm_reranker(config_json: Mapping[str, Any]) -> bool:
    """A rerank folder whose model is a causal LM (Qwen3-Reranker), not a
    cross-encoder: the one that reads an instruction."""
    return any(str(a).endswith("ForCausalLM") for a in config_json.get("architectures") or ())


# mlx-audio's model types, for a folder whose entry names no kind.
_SPEECH_TO_TEXT = ("whisper", "parakeet", "parakeet_tdt")
_TEXT_TO_SPEECH = ("soprano", "kokoro")
_CROSS_ENCODERS = ("BertForSequenceClassification", "XLMRobertaForSequenceClassification")
_ENCODERS = ("BertModel", "XLMRobertaModel", "ModernBertModel", "NomicBertModel")


# Files an MLX model needs; skips the PyTorch/GGUF copies many repos also carry.
_DOWNLOAD_PATTERNS = [
    "*.json",
    "*.safetensors",
    "*.py",
    "*.txt",
    "*.model",
    "*.tiktoken",
    "*.jinja",
]


def download_from_hub(repo_id: str, cache_dir: Path) -> Path:
    """Fetch ``repo_id`` into the Hub cache (only for ``allow_download: true``)."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError:  # pragma: no cover - mlx-lm depends on it
        raise ConfigError("downloading needs the huggingface_hub package") from None
    logger.info("downloading %s into %s", repo_id, cache_dir)
    try:
        folder = snapshot_download(repo_id, cache_dir=cache_dir, allow_patterns=_DOWNLOAD_PATTERNS)
    except Exception as exc:  # the hub raises many types; report them uniformly
        raise ConfigError(f"downloading `{repo_id}` failed: {type(exc).__name__}") from None
    return Path(folder)
