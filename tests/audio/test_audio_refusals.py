"""Speech requests in the activity log and in an app's usage: each refused
before planning (no key, a bad key, an unknown model, a non-audio upload,
text over the bound) is a row with its status and its OpenAI error's
message, and counts as an error of the app that sent it, without loading
a model; a planned one is its own single row (test_audio_residency.py checks that one, where the
model is warm)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from audio.conftest import RATE, sweep
from mlxd.engine.audio_files import write_file
from support.daemon import Daemon, daemon_in_thread, wait_until, write_registry

pytestmark = pytest.mark.mlx

DICTATION, OPS = "sk-dictation-31f0", "sk-ops-audio-77c2"


def _sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, whisper_dir: Path, soprano_dir: Path) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("audio-refusals")
    registry = write_registry(tmp, [
        {"name": "whisper", "path": str(whisper_dir), "kind": "transcription"},
        {"name": "soprano", "path": str(soprano_dir), "kind": "speech"},
    ], server={"max_speech_chars": 40})
    doc = yaml.safe_load(registry.read_text())
    doc["apps"] = [{"name": "dictation", "key_sha256": _sha(DICTATION), "models": ["whisper", "soprano"]},
                   {"name": "ops", "key_sha256": _sha(OPS), "admin": True}]
    registry.write_text(yaml.safe_dump(doc, sort_keys=False))
    with daemon_in_thread(registry, tmp) as d:
        yield d


def _rows(daemon: Daemon, request_id: str) -> list[dict]:
    return httpx.get(f"{daemon.url}/v1/activity", params={"request_id": request_id},
                     headers={"Authorization": f"Bearer {OPS}"}).json()["data"]


def _usage(daemon: Daemon, model: str) -> dict:
    status = httpx.get(f"{daemon.url}/v1/status", headers={"Authorization": f"Bearer {DICTATION}"}).json()
    return next((u for u in status["usage"] if u["model"] == model), {"requests": 0, "errors": 0})


def test_refused_speech_requests_are_rows_and_count_in_the_apps_usage(daemon) -> None:
    url = daemon.url + "/v1/audio"
    ok_file = {"file": ("a.wav", write_file(sweep(0.5), RATE, "wav"))}

    def as_app(rid: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {DICTATION}", "X-Request-Id": rid}

    before = _usage(daemon, "whisper"), _usage(daemon, "soprano")
    refusals = {
        "no-key": httpx.post(url + "/transcriptions", files=ok_file, data={"model": "whisper"},
                             headers={"X-Request-Id": "no-key"}),
        "bad-key": httpx.post(url + "/speech", json={"model": "soprano", "input": "Hi."},
                              headers={"Authorization": "Bearer sk-wrong", "X-Request-Id": "bad-key"}),
        "no-model": httpx.post(url + "/transcriptions", files=ok_file, data={"model": "nope", "stream": "true"},
                               headers=as_app("no-model")),
        "not-audio": httpx.post(url + "/translations", files={"file": ("a.wav", b"plain text, not sound" * 20)},
                                data={"model": "whisper"}, headers=as_app("not-audio")),
        "too-long": httpx.post(url + "/speech", json={"model": "soprano", "input": "word " * 20},
                               headers=as_app("too-long")),
    }
    for rid, answer in refusals.items():
        assert 400 <= answer.status_code < 500, (rid, answer.text)
        message = answer.json()["error"]["message"]
        row = wait_until(lambda rid=rid: next(iter(_rows(daemon, rid)), None), timeout=5)
        assert (row["status"], row["error"]) == (answer.status_code, message), rid
    rows = {rid: _rows(daemon, rid)[0] for rid in refusals}
    assert rows["no-key"]["key"] == "-" and rows["no-key"]["surface"] == "transcription"
    assert rows["bad-key"]["surface"] == "speech"
    # A name no entry answers to is counted as one; the row's message names it.
    assert (rows["no-model"]["model"], rows["no-model"]["stream"], rows["no-model"]["key"]) == ("(unknown)", True,
                                                                                               "dictation")
    assert "`nope`" in rows["no-model"]["error"]
    assert (rows["not-audio"]["model"], rows["not-audio"]["surface"]) == ("whisper", "translation")
    assert rows["not-audio"]["status"] == 400 and rows["too-long"]["model"] == "soprano"
    # The app's three refusals are its errors; the keyless and bad-key ones are nobody's.
    after = _usage(daemon, "whisper"), _usage(daemon, "soprano")
    assert [(a["requests"] - b["requests"], a["errors"] - b["errors"]) for a, b in zip(after, before)] == [
        (1, 1), (1, 1)]
    assert _usage(daemon, "(unknown)")["errors"] == 1
    status = httpx.get(f"{daemon.url}/v1/status", headers={"Authorization": f"Bearer {OPS}"}).json()
    assert {m["name"]: m["state"] for m in status["models"]} == {"whisper": "unloaded", "soprano": "unloaded"}
