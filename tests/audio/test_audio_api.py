"""The speech routes end to end with the official openai client, against
mlx-audio called directly on the same input: the same text, the same samples."""

from __future__ import annotations


import httpx
import mlx.core as mx
import numpy as np
import openai
import pytest

from audio.conftest import RATE, sweep
from support.daemon import wait_until
from mlxd.engine.audio_files import probe, decode, write_file

pytestmark = pytest.mark.mlx


def client(daemon) -> openai.OpenAI:
    return openai.OpenAI(base_url=daemon.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def direct_whisper(whisper_dir):
    from mlx_audio.stt.utils import load

    return load(str(whisper_dir))


@pytest.fixture(scope="module")
def direct_soprano(soprano_dir):
    from mlx_audio.tts.utils import load_model

    return load_model(soprano_dir)


@pytest.fixture(scope="module")
def sweep_files(tmp_path_factory) -> dict[str, bytes]:
    audio = sweep()
    return {fmt: write_file(audio, RATE, fmt) for fmt in ("wav", "flac", "mp3")}


def test_transcripts_are_what_mlx_audio_writes_for_the_same_file(audio_daemon, direct_whisper, sweep_files,
                                                                  tmp_path) -> None:
    """verbose_json against mlx-audio's defaults on the file itself (the
    temperature set, so one decode per window)."""
    path = tmp_path / "sweep.flac"
    path.write_bytes(sweep_files["flac"])
    mx.random.seed(0)
    expected = direct_whisper.generate(str(path), temperature=0.4)
    with open(path, "rb") as f:
        got = client(audio_daemon).audio.transcriptions.create(
            model="whisper", file=f, response_format="verbose_json", temperature=0.4,
            timestamp_granularities=["segment"])
    assert got.text == expected.text.strip() and got.text
    assert [s.text for s in got.segments] == [s["text"] for s in expected.segments]
    assert [(s.start, s.end) for s in got.segments] == [(round(s["start"], 3), round(s["end"], 3))
                                                         for s in expected.segments]
    assert [list(s.tokens) for s in got.segments] == [list(s["tokens"]) for s in expected.segments]
    assert got.language == "english" and got.duration == 2.0


def test_word_timestamps_are_mlx_audios_own(audio_daemon, direct_whisper, sweep_files, tmp_path) -> None:
    """``timestamp_granularities[]=word``: mlx-audio's word timestamps (its
    cross-attention DTW) as OpenAI writes them, the words stripped of their
    leading space; asked with segments too, both lists come back."""
    path = tmp_path / "sweep.wav"
    path.write_bytes(sweep_files["wav"])
    mx.random.seed(0)
    expected = direct_whisper.generate(str(path), temperature=0.4, word_timestamps=True)
    words = [(w["word"].strip(), round(w["start"], 3), round(w["end"], 3))
             for s in expected.segments for w in s.get("words") or ()]
    assert words
    api = client(audio_daemon)
    only = api.audio.transcriptions.create(model="whisper", file=("sweep.wav", sweep_files["wav"]),
                                           response_format="verbose_json", temperature=0.4,
                                           timestamp_granularities=["word"])
    assert [(w.word, w.start, w.end) for w in only.words] == words
    assert only.segments is None and only.text == expected.text.strip()
    both = api.audio.transcriptions.create(model="whisper", file=("sweep.wav", sweep_files["wav"]),
                                           response_format="verbose_json", temperature=0.4,
                                           timestamp_granularities=["word", "segment"])
    assert [(w.word, w.start, w.end) for w in both.words] == words
    assert [s.text for s in both.segments] == [s["text"] for s in expected.segments]


def test_word_timestamps_need_verbose_json(audio_daemon) -> None:
    """OpenAI's rule: words come only in verbose_json; any other format is a
    400 naming the parameter, before the upload is decoded or a model loaded."""
    api = client(audio_daemon)
    for fmt in ("json", "text", "srt", "vtt"):
        with pytest.raises(openai.BadRequestError) as refused:
            api.audio.transcriptions.create(model="whisper", file=("a.wav", write_file(sweep(0.5), RATE, "wav")),
                                            response_format=fmt, timestamp_granularities=["word"])
        error = refused.value.body
        assert error["param"] == "timestamp_granularities[]" and error["type"] == "invalid_request_error"
        assert "verbose_json" in error["message"]


def test_every_response_format_through_the_openai_client(audio_daemon, direct_whisper, sweep_files,
                                                         tmp_path) -> None:
    path = tmp_path / "sweep.wav"
    path.write_bytes(sweep_files["wav"])
    mx.random.seed(0)
    plain = direct_whisper.generate(str(path), temperature=0.4, return_timestamps=False)
    api = client(audio_daemon)
    outputs = {}
    for fmt in ("json", "text", "srt", "vtt"):
        outputs[fmt] = api.audio.transcriptions.create(
            model="whisper-1", file=("sweep.wav", sweep_files["wav"]), response_format=fmt, temperature=0.4)
    text = outputs["json"].text
    assert text == plain.text.strip() and text
    assert outputs["text"] == text + "\n"
    assert outputs["srt"].startswith("1\n00:00:00,000 --> ") and outputs["srt"].count(" --> ") >= 1
    assert outputs["vtt"].startswith("WEBVTT\n\n00:00:00.000 --> ")
    # srt and vtt carry the same cues.
    assert [line for line in outputs["srt"].splitlines() if " --> " not in line and not line.isdigit()] == [
        line for line in outputs["vtt"].splitlines()[2:] if " --> " not in line]


def test_translation_asks_the_model_for_its_translate_task(audio_daemon, direct_whisper, sweep_files,
                                                           tmp_path) -> None:
    path = tmp_path / "sweep.wav"
    path.write_bytes(sweep_files["wav"])
    mx.random.seed(0)
    expected = direct_whisper.generate(str(path), task="translate", language="fr", temperature=0.4,
                                       return_timestamps=False)
    got = client(audio_daemon).audio.translations.create(model="whisper", file=("sweep.wav", sweep_files["wav"]),
                                                         temperature=0.4,
                                                         extra_body={"language": "fr"})
    assert got.text == expected.text.strip()


def test_a_long_file_streams_a_delta_per_30_s_window(audio_daemon) -> None:
    """31 s: Whisper's 30 s window, then the last second, each its own
    worker step and its own delta; the last event has the whole text."""
    stream = client(audio_daemon).audio.transcriptions.create(
        model="whisper", file=("long.wav", write_file(sweep(31.0), RATE, "wav")), stream=True, temperature=0.4)
    events = list(stream)
    assert [e.type for e in events] == ["transcript.text.delta"] * 2 + ["transcript.text.done"]
    assert "".join(e.delta for e in events[:2]).strip() == events[-1].text


def test_speech_is_mlx_audios_samples_streamed_as_made(audio_daemon, direct_soprano) -> None:
    # Two lines, the second of two sentences: mlx-audio makes a result per
    # line, mlxd streams a chunk per sentence; the samples are the same.
    text = ("Hello there, this first line is spoken by a tiny random model.\n"
            "The second line has two sentences in it. Here is the last one, long enough.")
    mx.random.seed(0)
    expected = np.concatenate([np.asarray(r.audio, dtype=np.float32) for r in direct_soprano.generate(text)])
    api = client(audio_daemon)
    pcm = api.audio.speech.create(model="tts-1", voice="alloy", input=text, response_format="pcm").content
    samples = np.frombuffer(pcm, dtype="<i2")
    assert samples.size == expected.size > 0
    assert np.array_equal(samples, (np.clip(expected, -1, 1) * 32767).astype(np.int16))
    # Counted under the entry that `tts-1` names, as every alias is.
    metrics = httpx.get(audio_daemon.url + "/metrics").text
    made = next(line for line in metrics.splitlines()
                if line.startswith('mlxd_audio_seconds_total{model="soprano",task="speech"}'))
    assert float(made.split()[-1]) == pytest.approx(expected.size / 32000)
    with api.audio.speech.with_streaming_response.create(model="soprano", voice="default", input=text,
                                                         response_format="wav") as response:
        assert response.headers["content-type"] == "audio/wav"
        wav = b"".join(response.iter_bytes())
    assert wav[44:] == pcm
    for fmt in ("flac", "mp3"):
        encoded = api.audio.speech.create(model="soprano", voice="alloy", input=text, response_format=fmt).content
        decoded = decode(encoded, probe(encoded), 32000)
        assert abs(decoded.size - expected.size) < 3000


def test_a_client_that_leaves_a_speech_stream_is_counted_as_gone_and_frees_the_model(audio_daemon) -> None:
    """A player that stops listening mid-way is a 499 in the metrics and the
    request log (not a 500: nothing failed), and its lease goes back: the
    model unloads at once."""
    def counted(status: str) -> float:
        for line in httpx.get(audio_daemon.url + "/metrics").text.splitlines():
            if line.startswith(f'mlxd_requests_total{{model="soprano",status="{status}"}}'):
                return float(line.split()[-1])
        return 0.0

    before = counted("499"), counted("500")
    text = " ".join(f"Sentence number {i} is spoken here, one after the other." for i in range(30))
    with httpx.Client(base_url=audio_daemon.url, timeout=120) as http:
        with http.stream("POST", "/v1/audio/speech", json={"model": "soprano", "voice": "default", "input": text,
                                                           "response_format": "pcm"}) as response:
            assert response.status_code == 200
            assert next(response.iter_raw())  # the first sentence, then the client hangs up
        wait_until(lambda: counted("499") == before[0] + 1, timeout=60)
        assert counted("500") == before[1]
        assert http.post("/v1/models/soprano/unload", json={}).status_code == 200
        assert audio_daemon.model("soprano")["state"] == "unloaded"


def test_synthesised_speech_in_mp3_transcribes(audio_daemon) -> None:
    api = client(audio_daemon)
    wav = api.audio.speech.create(model="soprano", voice="alloy", input="Read this back to me.",
                                  response_format="wav").content
    samples = np.frombuffer(wav[44:], dtype="<i2").astype(np.float32) / 32768
    # 32 kHz speech in MP3, resampled to Whisper's 16 kHz as mlx-audio reads it.
    got = api.audio.transcriptions.create(model="whisper", file=("speech.mp3", write_file(samples, 32000, "mp3")),
                                          response_format="verbose_json", temperature=0.4)
    assert got.text and abs(got.duration - samples.size / 32000) < 0.1


def test_voices_are_listed_per_speech_model(audio_daemon) -> None:
    with httpx.Client(base_url=audio_daemon.url) as http:
        assert http.get("/v1/audio/voices").json()["data"] == [{"id": "default", "name": "default",
                                                                "model": "soprano"}]
        assert http.get("/v1/audio/voices", params={"model": "whisper"}).status_code == 400


def test_audio_models_are_resident_like_any_model(audio_daemon) -> None:
    whisper, soprano = audio_daemon.model("whisper"), audio_daemon.model("soprano")
    assert (whisper["kind"], soprano["kind"]) == ("transcription", "speech")
    with httpx.Client(base_url=audio_daemon.url, timeout=60) as http:
        assert http.post("/v1/models/whisper/load", json={}).status_code == 200
        whisper = audio_daemon.model("whisper")
        assert whisper["state"] == "loaded" and whisper["memory"]["measured_bytes"] > 0
        assert whisper["memory"]["weights_bytes"] > 0 and whisper["memory"]["kv_cache_bytes"] == 0
        assert 'model="whisper"' in http.get("/metrics").text
        assert http.post("/v1/models/whisper/unload", json={}).status_code == 200
        assert audio_daemon.model("whisper")["state"] == "unloaded"
        # A chat model asked to transcribe, and the other way round: 400s before any load.
        r = http.post("/v1/audio/transcriptions", files={"file": ("a.wav", write_file(sweep(0.5), RATE, "wav"))},
                      data={"model": "chat"})
        assert r.status_code == 400 and "is a text model, which this route does not serve; it serves POST " \
            "/v1/chat/completions" in r.json()["error"]["message"]
        r = http.post("/v1/chat/completions", json={"model": "whisper", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and "it serves POST /v1/audio/transcriptions" in r.json()["error"]["message"]
        assert r.json()["error"]["code"] == "model_not_supported"
        assert audio_daemon.model("whisper")["state"] == "unloaded"
