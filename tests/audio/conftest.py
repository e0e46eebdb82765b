"""Fixtures for the speech tests: the factory's tiny random Whisper and
Soprano (built once per machine), test audio made here (a sine sweep), and
one daemon serving both beside a tiny chat model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from mlxd.factory.audio import build_soprano, build_whisper
from support.daemon import Daemon, daemon_in_thread, write_registry

RATE = 16000


def sweep(seconds: float = 2.0, rate: int = RATE) -> np.ndarray:
    """A 200 Hz -> 2 kHz sine sweep at -10 dB."""
    t = np.arange(int(seconds * rate)) / rate
    f = 200 + (2000 - 200) * t / (2 * seconds)
    return (0.3 * np.sin(2 * np.pi * f * t)).astype(np.float32)


@pytest.fixture(scope="session")
def whisper_dir() -> Path:
    return build_whisper()


@pytest.fixture(scope="session")
def soprano_dir() -> Path:
    return build_soprano()


@pytest.fixture(scope="module")
def audio_daemon(tmp_path_factory: pytest.TempPathFactory, whisper_dir: Path, soprano_dir: Path) -> Iterator[Daemon]:
    """``whisper`` (transcription, alias whisper-1), ``soprano`` (speech,
    alias tts-1) and ``chat`` (a tiny text model)."""
    tmp = tmp_path_factory.mktemp("audio")
    registry = write_registry(tmp, [
        {"name": "whisper", "path": str(whisper_dir), "kind": "transcription", "aliases": ["whisper-1"]},
        {"name": "soprano", "path": str(soprano_dir), "kind": "speech", "aliases": ["tts-1"]},
        {"name": "chat", "model": "qwen"},
    ])
    with daemon_in_thread(registry, tmp) as daemon:
        yield daemon
