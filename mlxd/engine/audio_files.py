"""Audio files in and out, without MLX: what the speech routes read before a
lease and write after one.

Reading: the format comes from the first bytes; the header's duration and
channels are read first (``probe``), so a file too long for the bounds is
refused before a sample is decoded; ``decode`` then reads the file exactly
as mlx-audio's own ``load_audio`` does (``mlx_audio.audio_io.read``:
miniaudio, mlx-audio's resampler, mono float32), so the daemon's model sees
the samples a direct call would. A file that decodes to less than its
header says is a truncated file, refused. A header may leave the length
unknown (a streamed FLAC's total of 0, as mlxd's own speech route writes
it): such a file's samples are counted by decoding it, nothing kept, up to
a bound, and it is decoded to its end.

Writing: the 16-bit samples, WAV's header and whole files (tests and the
bench write their inputs with ``write_file``); a stream written as the
samples arrive is ``audio_stream``'s.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass

import numpy as np

from mlxd.errors import BadRequest

# What a request may send (OpenAI's list, less what needs ffmpeg here).
READABLE = "wav, mp3, flac or ogg (Vorbis)"
# What needs ffmpeg, as a refusal names it: mlx-audio hands these to ffmpeg,
# which this server does not require.
NEEDS_FFMPEG = {"m4a": "m4a", "webm": "webm", "opus": "Ogg Opus"}
# What /v1/audio/speech writes.
WRITE_FORMATS = ("wav", "pcm", "flac", "mp3")
MEDIA_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac", "mp3": "audio/mpeg"}
# libsndfile's container and encoding for each format it writes.
# (Opus is left out: libsndfile takes it only at 8-48 kHz rates that
# Soprano's 32 kHz is not, and resampling each chunk apart would click.)
SOUNDFILE = {"flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III")}
# A decoded file shorter than its header says by more than this is truncated.
TRUNCATION_TOLERANCE = 0.02


class InvalidAudio(BadRequest):
    """The uploaded file is not audio this daemon can read."""

    def __init__(self, message: str, code: str = "invalid_audio") -> None:
        super().__init__(message, param="file", code=code)


@dataclass(frozen=True)
class AudioInfo:
    format: str
    sample_rate: int
    channels: int
    seconds: float
    # False: the header gives no length (unknown, or none), ``seconds`` were counted.
    length_in_header: bool = True


def sniff(data: bytes) -> str | None:
    """The container from its first bytes."""
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "wav"
    if data[:4] == b"fLaC":
        return "flac"
    if data[:4] == b"OggS":
        return "opus" if _ogg_first_packet(data).startswith(b"OpusHead") else "ogg"
    if data[:3] == b"ID3" or (len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0):
        return "mp3"
    if data[4:8] == b"ftyp":
        return "m4a"
    if data[:4] == b"\x1aE\xdf\xa3":
        return "webm"
    return None


def _ogg_first_packet(data: bytes) -> bytes:
    """The start of an Ogg stream's first packet, which names its codec
    (Vorbis, Opus, ...): after the first page's 27-byte header and its
    segment table, whose length is the header's last byte (RFC 3533)."""
    if len(data) < 27:
        return b""
    start = 27 + data[26]
    return data[start:start + 8]


def probe(data: bytes, max_seconds: float | None = None) -> AudioInfo:
    """The file's format, rate, channels and duration, from its header (and,
    for MP3, a scan of its frames; where the header leaves the length
    unknown, a count of the samples, stopped once past ``max_seconds``).
    Raises InvalidAudio."""
    import miniaudio

    if not data:
        raise InvalidAudio("The file is empty (0 bytes).", code="empty_file")
    fmt = sniff(data)
    if fmt in NEEDS_FFMPEG:
        raise InvalidAudio(f"{NEEDS_FFMPEG[fmt]} files are not supported here (they need ffmpeg); send "
                           f"{READABLE}.", code="unsupported_format")
    if fmt is None:
        raise InvalidAudio(f"The file is not audio in a format this server reads ({READABLE}).",
                           code="invalid_file_format")
    get_info = {"wav": miniaudio.wav_get_info, "flac": miniaudio.flac_get_info, "mp3": miniaudio.mp3_get_info,
                "ogg": miniaudio.vorbis_get_info}[fmt]
    try:
        info = get_info(data)
    except Exception as exc:  # miniaudio.DecodeError and friends: a broken header
        raise InvalidAudio(f"The {fmt} file cannot be read: its header is damaged or incomplete.") from exc
    if info.sample_rate <= 0 or info.nchannels <= 0:
        raise InvalidAudio(f"The {fmt} file declares no samples.")
    if fmt == "wav" and _wav_cut_short(data):
        raise InvalidAudio("The wav file is truncated: its data chunk is shorter than its header says.",
                           code="truncated_file")
    if info.num_frames <= 0:
        counted = _counted_frames(data, fmt, info.sample_rate, max_seconds)
        return AudioInfo(fmt, info.sample_rate, info.nchannels, counted / info.sample_rate, length_in_header=False)
    return AudioInfo(fmt, info.sample_rate, info.nchannels, info.num_frames / info.sample_rate)


def _counted_frames(data: bytes, fmt: str, sample_rate: int, max_seconds: float | None) -> int:
    """The frames of a file whose header leaves its length unknown, decoded
    a second at a time and let go: a bound is all the header could have
    given, and a small file of silence can hold hours. Past ``max_seconds``
    the count stops (it is over the bound either way)."""
    import miniaudio

    limit = None if max_seconds is None else int(max_seconds * sample_rate)
    frames = 0
    try:
        for chunk in miniaudio.stream_memory(data, output_format=miniaudio.SampleFormat.SIGNED16, nchannels=1,
                                             sample_rate=sample_rate, frames_to_read=sample_rate):
            frames += len(chunk)
            if limit is not None and frames > limit:
                break
    except Exception as exc:  # miniaudio.DecodeError and friends
        raise InvalidAudio(f"The {fmt} file cannot be decoded: its data is damaged.") from exc
    return frames


def _wav_cut_short(data: bytes) -> bool:
    """Whether the data chunk holds fewer bytes than its size field (miniaudio
    reads such a file as a shorter one). A streamed WAV's unknown size
    (0 or 0xFFFFFFFF, give or take its header) is not a promise."""
    at = 12
    while at + 8 <= len(data):
        name, size = data[at:at + 4], struct.unpack("<I", data[at + 4:at + 8])[0]
        if name == b"data":
            return 0 < size < 0xFFFFFFFF - 64 and at + 8 + size > len(data)
        at += 8 + size + (size & 1)
    return False


def decode(data: bytes, info: AudioInfo, sample_rate: int) -> np.ndarray:
    """Mono float32 samples at ``sample_rate``, as mlx-audio reads a file."""
    from mlx_audio.audio_io import read

    try:
        if info.format == "ogg":
            samples = _decode_vorbis(data, sample_rate)
        elif not info.length_in_header:
            samples = _decode_native(data, info.sample_rate, sample_rate)
        else:
            samples, _ = read(io.BytesIO(data), dtype="float32", sample_rate=sample_rate, nchannels=1)
    except Exception as exc:
        raise InvalidAudio(f"The {info.format} file cannot be decoded: its data is damaged.") from exc
    samples = np.asarray(samples, dtype=np.float32).reshape(-1)
    expected = info.seconds * sample_rate
    if expected > 0 and samples.size < expected * (1 - TRUNCATION_TOLERANCE) - 1:
        raise InvalidAudio(
            f"The {info.format} file is truncated: its header promises {info.seconds:.2f} s, "
            f"its data holds {samples.size / sample_rate:.2f} s.", code="truncated_file")
    if samples.size == 0:
        raise InvalidAudio("The file holds no audio samples.", code="empty_audio")
    return samples


def _decode_vorbis(data: bytes, sample_rate: int) -> np.ndarray:
    """Ogg Vorbis through miniaudio (mlx-audio hands it to ffmpeg)."""
    import miniaudio

    sound = miniaudio.vorbis_read(data)
    samples = np.frombuffer(sound.samples, dtype=np.int16).astype(np.float32) / 32768.0
    return _resampled(samples.reshape(-1, sound.nchannels).mean(axis=1), sound.sample_rate, sample_rate)


def _decode_native(data: bytes, file_rate: int, sample_rate: int) -> np.ndarray:
    """A file of unknown length, to its end. mlx-audio's reader sizes its
    resampler by the header's length and reads nothing of such a file; this
    is its own decode (miniaudio's mono 16-bit at the file's rate) and its
    own filter over the whole buffer, which its chunked one equals."""
    import miniaudio

    sound = miniaudio.decode(data, output_format=miniaudio.SampleFormat.SIGNED16, nchannels=1,
                             sample_rate=file_rate)
    return _resampled(np.frombuffer(sound.samples, dtype=np.int16).astype(np.float32) / 32768.0, file_rate,
                      sample_rate)


def _resampled(samples: np.ndarray, rate: int, sample_rate: int) -> np.ndarray:
    from mlx_audio.utils import resample_audio

    if rate != sample_rate:
        samples = resample_audio(samples, rate, sample_rate, axis=0)
    return np.asarray(samples, dtype=np.float32)


# --- writing -------------------------------------------------------------------


def to_int16(samples: np.ndarray) -> np.ndarray:
    """Signed 16-bit samples, as mlx-audio writes them."""
    return (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2")


def pcm16(samples: np.ndarray) -> bytes:
    """Little-endian signed 16-bit samples, as mlx-audio writes them."""
    return to_int16(samples).tobytes()


def wav_header(sample_rate: int, frames: int | None = None) -> bytes:
    """A mono 16-bit WAV header; ``frames=None``: length unknown (streamed),
    the sizes at their maximum, as streaming servers write them."""
    data = 0xFFFFFFFF - 36 if frames is None else frames * 2
    return (b"RIFF" + struct.pack("<I", min(36 + data, 0xFFFFFFFF)) + b"WAVE" + b"fmt "
            + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
            + b"data" + struct.pack("<I", data))


def write_file(samples: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """A whole file, its header complete (tests and the bench write their inputs with it)."""
    if fmt in ("wav", "pcm"):
        return (wav_header(sample_rate, samples.size) if fmt == "wav" else b"") + pcm16(samples)
    import soundfile

    container, subtype = SOUNDFILE[fmt]
    out = io.BytesIO()
    soundfile.write(out, to_int16(samples), sample_rate, format=container, subtype=subtype)
    return out.getvalue()
