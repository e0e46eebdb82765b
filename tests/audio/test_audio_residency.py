"""The audio kinds through every residency path, in one daemon whose budget
holds one of the tiny whisper and soprano at a time: preload, LRU eviction
both ways, pinning, a hot reload that changes an audio entry, idle unload,
and what /v1/status (the dashboard's JSON) and /metrics say of them. The
tests run in order, each from the state the last one left."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from audio.conftest import RATE, sweep
from mlxd.engine.audio_files import write_file
from reload.harness import ReloadingDaemon, registry_doc, reloading_daemon, replace_atomically
from support.daemon import Daemon, daemon_in_thread, wait_until, write_registry

pytestmark = pytest.mark.mlx

# Each charged 200 MB, more than either measures, so the learned footprint
# never moves the arithmetic; the budget holds one, not both.
EACH = {"estimated_memory_gb": 0.2}
BUDGET = {"memory_budget": "300MB", "contention_policy": {"strategy": "fail"}}
CLIP = write_file(sweep(0.5), RATE, "wav")


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, whisper_dir: Path, soprano_dir: Path) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("audio-residency")
    entries = {
        "whisper": {"name": "whisper", "path": str(whisper_dir), "kind": "transcription", "preload": True, **EACH},
        "soprano": {"name": "soprano", "path": str(soprano_dir), "kind": "speech", **EACH},
    }
    registry = tmp / "models.yaml"
    registry.write_text(registry_doc(tmp, list(entries.values()), manager=BUDGET))
    with reloading_daemon(registry, tmp, watch=False) as daemon:
        yield {"daemon": daemon, "entries": entries, "tmp": tmp}


def edit(setup: dict[str, Any], name: str, **fields: Any) -> dict[str, Any]:
    """Change one entry on disk and reload; the reload's report of it."""
    setup["entries"][name] = {**setup["entries"][name], **fields}
    d: ReloadingDaemon = setup["daemon"]
    replace_atomically(d.registry, registry_doc(setup["tmp"], list(setup["entries"].values()), manager=BUDGET))
    answer = d.reload()
    assert answer.status_code == 200, answer.text
    return answer.json()["models"][name]


def transcribe(d: Daemon, model: str = "whisper") -> httpx.Response:
    return httpx.post(f"{d.url}/v1/audio/transcriptions", files={"file": ("a.wav", CLIP)},
                      data={"model": model, "temperature": "0.4"}, timeout=120)


def speak(d: Daemon, text: str = "Hi.", request_id: str = "", model: str = "soprano") -> httpx.Response:
    """"Hi." makes no samples from the random weights (and costs nothing):
    enough to load the model; "Hello there." makes 0.6 s."""
    return httpx.post(f"{d.url}/v1/audio/speech", json={"model": model, "input": text, "voice": "alloy",
                                                         "response_format": "pcm"}, timeout=120,
                      headers={"X-Request-Id": request_id} if request_id else {})


def states(d: ReloadingDaemon) -> dict[str, str]:
    return {m["name"]: m["state"] for m in d.status()["models"]}


def rows(d: ReloadingDaemon, request_id: str) -> list[dict[str, Any]]:
    """The activity rows of one request, once the log has written them."""
    d.ctx.activity.flush()
    return httpx.get(f"{d.url}/v1/activity", params={"request_id": request_id}, timeout=10).json()["data"]


def metric(d: ReloadingDaemon, name: str, model: str, extra: str = "") -> float:
    text = httpx.get(f"{d.url}/metrics", timeout=10).text
    prefix = f'{name}{{model="{model}"{extra}}} '
    return float(next(line for line in text.splitlines() if line.startswith(prefix)).split()[-1])


def test_the_preloaded_transcription_model_is_resident_before_the_first_request(setup) -> None:
    d = setup["daemon"]
    assert states(d) == {"whisper": "loaded", "soprano": "unloaded"}
    whisper = d.model("whisper")
    assert whisper["kind"] == "transcription" and whisper["load_count"] == 1
    assert d.model("soprano")["kind"] == "speech"
    assert metric(d, "mlxd_model_state", "whisper", ',state="loaded"') == 1.0
    assert metric(d, "mlxd_model_state", "soprano", ',state="unloaded"') == 1.0


def test_each_kind_evicts_the_other_under_a_budget_for_one(setup) -> None:
    d = setup["daemon"]
    assert speak(d).status_code == 200
    assert states(d) == {"whisper": "unloaded", "soprano": "loaded"}
    heard = transcribe(d)
    assert heard.status_code == 200 and heard.json()["text"]
    setup["heard"] = heard.json()["text"]
    assert states(d) == {"whisper": "loaded", "soprano": "unloaded"}
    evictions = [e for e in d.status()["events"] if e["kind"] == "evict"]
    assert [e["model"] for e in evictions[-2:]] == ["whisper", "soprano"]
    assert "make room for soprano" in evictions[-2]["message"]
    assert "make room for whisper" in evictions[-1]["message"]
    assert metric(d, "mlxd_model_evictions_total", "whisper") == 1.0
    assert metric(d, "mlxd_model_evictions_total", "soprano") == 1.0
    assert d.model("whisper")["load_count"] == 2
    memory = d.status()["memory"]
    assert memory["committed_bytes"] <= memory["budget_bytes"]


def test_a_pinned_transcription_model_stays_and_the_speech_request_is_refused(setup) -> None:
    d = setup["daemon"]
    assert edit(setup, "whisper", pinned=True)["change"] != "reload", "pinning applies without a reload"
    assert d.model("whisper")["pinned"] is True
    refused = speak(d, request_id="refused")
    assert refused.status_code == 503, refused.text
    # Refused once planned: the path's own row, one, with the client's message.
    assert [(r["status"], r["error"]) for r in rows(d, "refused")] == [(503, refused.json()["error"]["message"])]
    assert states(d) == {"whisper": "loaded", "soprano": "unloaded"}
    edit(setup, "whisper", pinned=False)
    spoken = speak(d, "Hello there.", request_id="spoken")
    assert spoken.status_code == 200 and spoken.content
    assert [(r["status"], r["surface"], r["model"], r["error"]) for r in rows(d, "spoken")] == [
        (200, "speech", "soprano", None)]
    assert states(d) == {"whisper": "unloaded", "soprano": "loaded"}
    setup["spoken"] = spoken.content


def test_a_hot_reload_that_moves_an_audio_entry_loads_the_new_files(setup) -> None:
    d = setup["daemon"]
    copy = setup["tmp"] / "soprano-copy"
    shutil.copytree(setup["entries"]["soprano"]["path"], copy)
    change = edit(setup, "soprano", path=str(copy))
    assert change["change"] == "reload" and "path" in change["fields"]
    assert speak(d, "Hello there.").content == setup["spoken"], "the same weights from the new folder speak the same samples"
    assert [p for name, p in d.factory.loads if name == "soprano"][-1] == copy.name
    events = [e["kind"] for e in d.status()["events"] if e["model"] == "soprano"]
    assert events[-2:] == ["unload", "load"]
    assert d.model("soprano")["path"].endswith(copy.name)


def test_an_idle_audio_model_unloads_after_its_seconds(setup) -> None:
    d = setup["daemon"]
    assert edit(setup, "soprano", idle_unload_seconds=1)["change"] != "reload"
    assert speak(d).status_code == 200
    assert d.model("soprano")["idle_unload_at"] is not None
    wait_until(lambda: d.model("soprano")["state"] == "unloaded", timeout=15)
    unloads = [e for e in d.status()["events"] if e["kind"] == "unload" and e["model"] == "soprano"]
    assert "idle" in unloads[-1]["message"]
    assert metric(d, "mlxd_model_state", "soprano", ',state="unloaded"') == 1.0


def test_audio_entries_on_a_backend_are_relayed_to_it(setup) -> None:
    """A front daemon whose entries are this daemon's two models: the same
    transcript and the same samples as asking this one, the backend's
    refusal passed on."""
    back = setup["daemon"]
    front_dir = setup["tmp"] / "front"
    front_dir.mkdir()
    registry = write_registry(front_dir, [
        {"name": "far-whisper", "backend": "up", "remote_model": "whisper", "kind": "transcription"},
        {"name": "far-soprano", "backend": "up", "remote_model": "soprano", "kind": "speech"},
    ], backends={"up": {"url": back.url + "/v1", "kind": "mlxd"}})
    with daemon_in_thread(registry, front_dir) as front:
        heard = transcribe(front, "far-whisper")
        assert heard.status_code == 200, heard.text
        assert heard.json()["text"] == setup["heard"]
        spoken = speak(front, "Hello there.", model="far-soprano")
        assert spoken.status_code == 200 and spoken.content == setup["spoken"]
        refused = httpx.post(f"{front.url}/v1/audio/speech", json={"model": "far-soprano", "input": "Hi.",
                                                                   "speed": 2.0}, timeout=60)
        assert refused.status_code == 400 and "speed" in refused.json()["error"]["message"]
