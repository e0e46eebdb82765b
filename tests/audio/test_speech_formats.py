"""Synthesised speech as a listener's program reads it: every encoded
format decodes, in more than one reader, to the samples the same request
gives as raw PCM."""

from __future__ import annotations

import io

import httpx
import miniaudio
import numpy as np
import pytest
import soundfile

pytestmark = pytest.mark.mlx

RATE = 32000  # Soprano's
# Sentence after sentence: the audio comes in many chunks and runs long
# enough (several seconds) for a wrong length estimate to show.
TEXT = " ".join(f"Sentence number {i} is spoken here, one after the other." for i in range(12))
# LAME's delay (576 + 529 samples) and the last frame's padding (< 1152).
MP3_SLACK = 2 * 1152


def speech(daemon, fmt: str, text: str = TEXT) -> bytes:
    r = httpx.post(daemon.url + "/v1/audio/speech", timeout=300,
                   json={"model": "tts-1", "voice": "alloy", "input": text, "response_format": fmt})
    assert r.status_code == 200, r.text
    return r.content


@pytest.fixture(scope="module")
def pcm(audio_daemon) -> np.ndarray:
    return np.frombuffer(speech(audio_daemon, "pcm"), dtype="<i2")


def test_streamed_mp3_decodes_whole_in_libsndfile_and_miniaudio(audio_daemon, pcm) -> None:
    """A streamed MP3 cannot go back to fill in LAME's Xing/Info frame; with
    a variable bitrate libsndfile guessed the length from its first frame
    and soundfile read half the speech."""
    mp3 = speech(audio_daemon, "mp3")
    by_soundfile, rate = soundfile.read(io.BytesIO(mp3), dtype="int16")
    by_miniaudio = miniaudio.decode(mp3, nchannels=1, sample_rate=RATE).num_frames
    assert rate == RATE and pcm.size > 3 * RATE
    assert 0 <= by_soundfile.shape[0] - pcm.size <= MP3_SLACK
    assert 0 <= by_miniaudio - pcm.size <= MP3_SLACK


def test_streamed_flac_is_the_pcm_and_transcribes_through_the_same_daemon(audio_daemon, pcm) -> None:
    """A streamed FLAC's header leaves its length unknown; mlxd refused
    its own FLAC ("The file holds no audio samples."). Lossless, it is the
    same 16-bit samples as the pcm of the same request."""
    flac = speech(audio_daemon, "flac")
    decoded = np.frombuffer(miniaudio.decode(flac, nchannels=1, sample_rate=RATE).samples, dtype=np.int16)
    assert np.array_equal(decoded, pcm)
    r = httpx.post(audio_daemon.url + "/v1/audio/transcriptions", timeout=300,
                   files={"file": ("speech.flac", flac)},
                   data={"model": "whisper-1", "response_format": "verbose_json", "temperature": "0.4"})
    assert r.status_code == 200, r.text
    assert r.json()["duration"] == pytest.approx(pcm.size / RATE, abs=1e-3)


@pytest.mark.parametrize("text", ["   ", "\n\n", " \t\u3000"])
def test_input_with_nothing_to_speak_is_a_400_naming_input(audio_daemon, text) -> None:
    """It was a 200 with an empty body, or a WAV header claiming 4 GB."""
    r = httpx.post(audio_daemon.url + "/v1/audio/speech", timeout=60,
                   json={"model": "tts-1", "voice": "alloy", "input": text, "response_format": "wav"})
    assert r.status_code == 400, r.content[:100]
    error = r.json()["error"]
    assert (error["param"], error["type"]) == ("input", "invalid_request_error")
    assert "nothing to speak" in error["message"]
