"""Audio files in and out without a model: what the header says, what
decodes, what is refused, what the speech route writes, and the subtitle
formats of a transcript."""

from __future__ import annotations

import io
import time

import miniaudio
import numpy as np
import pytest
import soundfile

from audio.conftest import RATE, sweep
from mlxd.api.audio import answers
from mlxd.engine.audio import Window
from mlxd.engine.audio_files import InvalidAudio, decode, probe, write_file
from mlxd.engine.audio_stream import StreamEncoder


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3"])
def test_each_format_reads_back_at_16k_with_its_length_from_the_header(fmt) -> None:
    audio = sweep(1.0, 32000)
    data = write_file(audio, 32000, fmt)
    info = probe(data)
    assert (info.format, info.sample_rate, info.channels) == (fmt, 32000, 1)
    assert abs(info.seconds - 1.0) < 0.05
    samples = decode(data, info, RATE)
    assert samples.dtype == np.float32 and abs(samples.size - RATE) < 0.05 * RATE


def test_ogg_vorbis_is_read_without_ffmpeg() -> None:
    out = io.BytesIO()
    soundfile.write(out, sweep(0.5), RATE, format="OGG", subtype="VORBIS")
    data = out.getvalue()
    assert decode(data, probe(data), RATE).size == RATE // 2


@pytest.mark.parametrize("data, code", [
    (b"", "empty_file"),
    (b"just some text, no audio", "invalid_file_format"),
    (b"\x00\x00\x00\x18ftypmp42" + b"\x00" * 32, "unsupported_format"),
    (b"RIFF\x24\x00\x00\x00WAVE", "invalid_audio"),
])
def test_what_is_not_audio_is_named(data, code) -> None:
    with pytest.raises(InvalidAudio) as caught:
        decode(data, probe(data), RATE)
    assert caught.value.code == code and caught.value.param == "file" and caught.value.status_code == 400


@pytest.mark.parametrize("fmt", ["wav", "flac"])
def test_a_cut_file_is_truncated_not_short(fmt) -> None:
    data = write_file(sweep(2.0), RATE, fmt)
    with pytest.raises(InvalidAudio) as caught:
        cut = data[: len(data) // 2]
        decode(cut, probe(cut), RATE)
    assert caught.value.code == "truncated_file"


@pytest.mark.parametrize("fmt", ["wav", "pcm", "flac", "mp3"])
def test_streamed_speech_is_one_valid_file_of_every_chunk(fmt) -> None:
    audio = sweep(1.0, 32000)
    encoder = StreamEncoder(fmt, 32000)
    parts = [encoder.feed(audio[:16000]), encoder.feed(audio[16000:]), encoder.close()]
    assert parts[0]  # the first chunk goes out before the second is made
    data = b"".join(parts)
    if fmt == "pcm":
        assert np.array_equal(np.frombuffer(data, "<i2"), (audio * 32767).astype(np.int16))
    else:
        got = decode(data, probe(data), 32000)
        # MP3 pads to whole 1,152-sample frames plus the encoder's delay.
        assert abs(got.size - audio.size) < 3 * 1152
        if fmt == "wav":
            assert np.array_equal(np.frombuffer(data[44:], "<i2"), (audio * 32767).astype(np.int16))


@pytest.mark.parametrize("fmt", ["wav", "pcm", "flac", "mp3"])
def test_a_synthesis_of_no_samples_is_a_valid_empty_file(fmt) -> None:
    """No chunk came: WAV's header claimed 4 GB of nothing, and FLAC and MP3
    were no bytes at all, which no reader opens."""
    data = StreamEncoder(fmt, 32000).close()
    if fmt == "pcm":
        assert data == b""
    elif fmt == "wav":
        assert data[4:8] == (36).to_bytes(4, "little") and data[40:44] == bytes(4) and len(data) == 44
        assert soundfile.read(io.BytesIO(data))[0].size == 0
    elif fmt == "flac":
        assert miniaudio.decode(data, nchannels=1, sample_rate=32000).num_frames == 0
    else:  # MP3 has no header: its shortest file is a few frames of silence.
        decoded, _ = soundfile.read(io.BytesIO(data))
        assert decoded.size <= 2 * 1152 and not decoded.any()
        assert miniaudio.decode(data, nchannels=1, sample_rate=32000).num_frames == decoded.size


def test_a_flac_of_unknown_length_reads_to_its_end_as_a_whole_one_does() -> None:
    """A streamed FLAC leaves its length unknown (a total of 0, which the
    FLAC spec allows); mlx-audio's reader sized its resampler by it and
    read no sample of such a file."""
    audio = sweep(3.0, 32000)
    encoder = StreamEncoder("flac", 32000)
    streamed = b"".join([encoder.feed(audio[:48000]), encoder.feed(audio[48000:]), encoder.close()])
    assert miniaudio.flac_get_info(streamed).num_frames == 0
    whole = write_file(audio, 32000, "flac")
    info = probe(streamed)
    assert (info.seconds, info.length_in_header) == (3.0, False)
    assert np.array_equal(decode(streamed, info, RATE), decode(whole, probe(whole), RATE))


def test_an_unknown_length_is_counted_only_up_to_the_bound() -> None:
    """Two hours of streamed silence at 8 kHz: 180 kB, counted past the
    30-minute bound and no further, in well under a second."""
    encoder = StreamEncoder("flac", 8000)
    silence = np.zeros(8000 * 600, dtype=np.float32)
    data = b"".join([encoder.feed(silence) for _ in range(12)] + [encoder.close()])
    started = time.monotonic()
    assert 1800 < probe(data, max_seconds=1800).seconds <= 1801
    assert time.monotonic() - started < 1


def test_subtitles_number_and_time_the_segments_across_windows() -> None:
    windows = [
        Window(" Hello there.", "en", [{"start": 0.0, "end": 1.5, "text": " Hello there."}], 0.0, 30.0),
        Window(" And after.", "en", [{"start": 31.25, "end": 3725.5, "text": " And after."}], 30.0, 60.0),
    ]
    assert answers.transcript_text(windows) == "Hello there. And after."
    assert answers.srt(windows) == ("1\n00:00:00,000 --> 00:00:01,500\nHello there.\n\n"
                                    "2\n00:00:31,250 --> 01:02:05,500\nAnd after.\n")
    assert answers.vtt(windows) == ("WEBVTT\n\n00:00:00.000 --> 00:00:01.500\nHello there.\n\n"
                                    "00:00:31.250 --> 01:02:05.500\nAnd after.\n")
