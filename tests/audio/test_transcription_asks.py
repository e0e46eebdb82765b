"""What a transcription request may ask, as a client sends it: the
language in the forms people write it, and clear 400s naming the field
for what cannot be served."""

from __future__ import annotations

import io

import httpx
import pytest
import soundfile

from audio.conftest import RATE, sweep
from mlxd.engine.audio_files import write_file

pytestmark = pytest.mark.mlx


@pytest.fixture(scope="module")
def wav() -> bytes:
    return write_file(sweep(1.0), RATE, "wav")


def transcribe(daemon, data: bytes, route: str = "transcriptions", name: str = "a.wav", **form: str):
    return httpx.post(f"{daemon.url}/v1/audio/{route}", timeout=300, files={"file": (name, data)},
                      data={"model": "whisper", "temperature": "0.4", **form})


def test_a_language_in_any_case_or_by_its_name_is_whispers_code(audio_daemon, wav) -> None:
    """"EN" reached Whisper as it came: no such language token, so it
    decoded with <|endoftext|> in its place, and verbose_json said "EN"."""
    as_code = transcribe(audio_daemon, wav, language="en", response_format="verbose_json").json()
    assert as_code["language"] == "english"
    for said in ("EN", "English", "en-US"):
        got = transcribe(audio_daemon, wav, language=said, response_format="verbose_json").json()
        assert (got["language"], got["text"], got["segments"]) == ("english", as_code["text"],
                                                                   as_code["segments"]), said


@pytest.mark.parametrize("route", ["transcriptions", "translations"])
@pytest.mark.parametrize("said", ["klingon", "xx"])
def test_an_unknown_language_is_a_400_naming_it(audio_daemon, wav, route, said) -> None:
    r = transcribe(audio_daemon, wav, route, language=said)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["param"], error["type"]) == ("language", "invalid_request_error")
    assert repr(said) in error["message"]


def test_a_language_the_checkpoint_has_no_token_for_is_a_400(audio_daemon, wav) -> None:
    """Cantonese is the tokenizer's 100th language; a 99-language Whisper
    (as the factory's is) has no token for it."""
    r = transcribe(audio_daemon, wav, language="Cantonese")
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "language" and "'yue'" in r.json()["error"]["message"]


def test_an_ogg_opus_voice_note_is_refused_as_a_format_that_needs_ffmpeg(audio_daemon) -> None:
    """WhatsApp's and Telegram's voice notes: it was "The ogg file cannot be
    read: its header is damaged", as if the file were broken."""
    note = io.BytesIO()
    soundfile.write(note, sweep(1.0, 48000), 48000, format="OGG", subtype="OPUS")
    r = transcribe(audio_daemon, note.getvalue(), name="voice.ogg")
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["code"], error["param"]) == ("unsupported_format", "file")
    assert "Ogg Opus" in error["message"] and "ffmpeg" in error["message"]
    assert all(fmt in error["message"] for fmt in ("wav", "mp3", "flac", "ogg (Vorbis)"))


def test_a_form_with_two_files_or_a_text_field_sent_as_a_file_says_which(audio_daemon, wav) -> None:
    """Both were "The multipart body cannot be read (HTTPException)." with
    no param: Starlette refused any second file before mlxd saw the form."""
    url = audio_daemon.url + "/v1/audio/transcriptions"
    two = httpx.post(url, files=[("file", ("a.wav", wav)), ("file", ("b.wav", wav))], data={"model": "whisper"})
    assert two.status_code == 400 and two.json()["error"]["param"] == "file"
    assert "one `file`" in two.json()["error"]["message"]
    for field in ("model", "language"):
        sent = {"model": "whisper"} if field != "model" else {}
        r = httpx.post(url, files=[("file", ("a.wav", wav)), (field, ("field.txt", b"whisper"))], data=sent)
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
        assert "text field, not a file" in r.json()["error"]["message"]


def test_a_second_windows_segments_seek_from_the_files_start(audio_daemon) -> None:
    """31 s: Whisper's 30 s window, then the last second. ``seek`` is in
    mel frames (100 a second) like Whisper's own; the second window's
    segments said start 30.0 but seek 0."""
    r = transcribe(audio_daemon, write_file(sweep(31.0), RATE, "wav"), response_format="verbose_json")
    segments = r.json()["segments"]
    later = [s for s in segments if s["start"] >= 30.0]
    assert later and all(s["seek"] >= 3000 for s in later)
    assert all(s["seek"] <= round(s["start"] * 100) for s in segments)


@pytest.mark.parametrize("form", [{"response_format": "verbose_json"}, {"response_format": "srt"},
                                  {"response_format": "verbose_json", "timestamp_granularities[]": "word"}])
def test_a_stream_of_text_events_refuses_formats_it_cannot_carry(audio_daemon, wav, form) -> None:
    """The events carry text: asked for with verbose_json, srt or words, a
    stream dropped them silently after computing them (word timestamps
    cost a second pass per window)."""
    r = transcribe(audio_daemon, wav, stream="true", **form)
    assert r.status_code == 400, r.text[:200]
    error = r.json()["error"]
    assert error["param"] == "stream" and form["response_format"] in error["message"]
