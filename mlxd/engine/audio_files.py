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

Writing: WAV and raw PCM are written here as the samples arrive; FLAC and
MP3 through libsndfile (``soundfile``, which ships it), also as
the samples arrive.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from mlxd.errors import BadRequest

# What a request may send (OpenAI's list, less what needs ffmpeg here).
READ_FORMATS = ("wav", "mp3", "flac", "ogg")
# What /v1/audio/speech writes.
WRITE_FORMATS = ("wav", "pcm", "flac", "mp3")
MEDIA_TYPES = {"wav": "audio/wav", "pcm": "audio/pcm", "flac": "audio/flac", "mp3": "audio/mpeg"}
# libsndfile's container and encoding for each format it writes.
# (Opus is left out: libsndfile takes it only at 8-48 kHz rates that
# Soprano's 32 kHz is not, and resampling each chunk apart would click.)
_SOUNDFILE = {"flac": ("FLAC", "PCM_16"), "mp3": ("MP3", "MPEG_LAYER_III")}
# MP3 at a constant bitrate, in kbps by the MPEG version the rate makes
# (MPEG-1 from 32 kHz, MPEG-2 from 16 kHz, MPEG-2.5 below; enough for
# speech in mono). A streamed MP3 has no Xing/Info frame (``_Mp3Head``),
# and without one a reader takes the length from the first frame's
# bitrate and the file's size: libsndfile (mpg123) does, and soundfile
# reads that many samples, so a variable bitrate cut a 43 s file to 21 s.
_MP3_KBPS = ((32000, 64), (16000, 48), (0, 32))
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
    # False: the header leaves the length unknown, ``seconds`` were counted.
    length_in_header: bool = True


def sniff(data: bytes) -> str | None:
    """The container from its first bytes."""
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "wav"
    if data[:4] == b"fLaC":
        return "flac"
    if data[:4] == b"OggS":
        return "ogg"
    if data[:3] == b"ID3" or (len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0):
        return "mp3"
    if data[4:8] == b"ftyp":
        return "m4a"
    if data[:4] == b"\x1aE\xdf\xa3":
        return "webm"
    return None


def probe(data: bytes, max_seconds: float | None = None) -> AudioInfo:
    """The file's format, rate, channels and duration, from its header (and,
    for MP3, a scan of its frames; where the header leaves the length
    unknown, a count of the samples, stopped once past ``max_seconds``).
    Raises InvalidAudio."""
    import miniaudio

    if not data:
        raise InvalidAudio("The file is empty (0 bytes).", code="empty_file")
    fmt = sniff(data)
    if fmt in ("m4a", "webm"):
        raise InvalidAudio(f"{fmt} files are not supported here (they need ffmpeg); send one of "
                           f"{', '.join(READ_FORMATS)}.", code="unsupported_format")
    if fmt is None:
        raise InvalidAudio(f"The file is not audio in a format this server reads ({', '.join(READ_FORMATS)}).",
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


class _Sink(io.RawIOBase):
    """A write-only file for libsndfile whose bytes are taken as they come.

    At the end libsndfile seeks back to complete FLAC's header (its total
    length) and MP3's Xing/Info frame; those bytes went out long ago, so
    writes behind the end are dropped: a streamed FLAC says "length
    unknown", which players accept, and MP3's placeholder frame is left
    out (``_without_tag_frame``)."""

    def __init__(self) -> None:
        self.pending = bytearray()
        self.end = 0
        self.cursor = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def write(self, b: bytes) -> int:  # type: ignore[override]
        size = len(b)
        if self.cursor + size > self.end:
            fresh = b[max(0, self.end - self.cursor):]
            self.pending += fresh
            self.end += len(fresh)
        self.cursor += size
        return size

    def seek(self, offset: int, whence: int = 0) -> int:
        self.cursor = {0: offset, 1: self.cursor + offset, 2: self.end + offset}[whence]
        return self.cursor

    def tell(self) -> int:
        return self.cursor

    def take(self) -> bytes:
        out, self.pending = bytes(self.pending), bytearray()
        return out


def _is_frame_sync(data: bytes | bytearray) -> bool:
    return len(data) >= 2 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0


def _without_tag_frame(head: bytes) -> bytes | None:
    """An MP3 stream's first bytes less LAME's placeholder for its
    Xing/Info frame, a frame header then zeros, which LAME fills in only by
    seeking back at the end: left in, every decoder plays it as a frame of
    silence, and some take the stream's length from it. None: not known
    yet (zeros so far). LAME writes no placeholder where the frame is too
    small to hold the tag: then ``head`` is returned as it is."""
    if len(head) < 4 or not _is_frame_sync(head):
        return None if len(head) < 4 else head
    rest = head[4:].lstrip(b"\0")
    if len(rest) < 2:
        return None
    return rest if _is_frame_sync(rest) else head


# A chunk of up to this many samples (20 s at 24 kHz) is cast to PCM on the
# event loop: well under a millisecond.
INLINE_SAMPLES = 480_000


class StreamEncoder:
    """Sample chunks in, the bytes of ``fmt`` out as soon as each chunk is
    encoded (WAV's header first, its length unknown)."""

    def __init__(self, fmt: str, sample_rate: int) -> None:
        if fmt not in WRITE_FORMATS:
            raise ValueError(f"cannot write {fmt}")
        self.fmt = fmt
        self.sample_rate = sample_rate
        self._sink: _Sink | None = None
        self._file: Any = None
        self._started = False
        # An MP3's first bytes until its placeholder frame is told apart.
        self._head: bytearray | None = None

    def cheap(self, samples: int) -> bool:
        """Whether encoding ``samples`` costs less than a hand-off to a thread
        and back: PCM and WAV are a clip and a cast (about 10 µs per second of
        audio here), up to INLINE_SAMPLES; FLAC's and MP3's encoders are not."""
        return self.fmt in ("pcm", "wav") and samples <= INLINE_SAMPLES

    def feed(self, samples: np.ndarray) -> bytes:
        head = b""
        if not self._started:
            self._started = True
            if self.fmt == "wav":
                head = wav_header(self.sample_rate)
            elif self.fmt != "pcm":
                import soundfile

                container, subtype = _SOUNDFILE[self.fmt]
                self._sink = _Sink()
                self._file = soundfile.SoundFile(self._sink, mode="w", samplerate=self.sample_rate, channels=1,
                                                 format=container, subtype=subtype,
                                                 **(_mp3_options(self.sample_rate) if self.fmt == "mp3" else {}))
                if self.fmt == "mp3":
                    self._head = bytearray()
        if self._file is None:
            return head + pcm16(samples)
        assert self._sink is not None
        # The same 16-bit samples as pcm and wav: libsndfile's own cast of
        # floats rounds where mlx-audio's truncates, and FLAC differed from
        # the pcm of the same request by a step in most samples.
        self._file.write(to_int16(samples))
        return self._taken()

    def close(self) -> bytes:
        """The encoder's last bytes (FLAC's and MP3's final frames)."""
        if self._file is None:
            return b"" if self._started else self.feed(np.zeros(0, np.float32))
        assert self._sink is not None
        self._file.close()
        self._file = None
        tail = self._taken()
        if self._head is not None:  # the stream ended while its head was undecided
            tail, self._head = bytes(self._head), None
        return tail

    def _taken(self) -> bytes:
        """The sink's new bytes; an MP3's held until its head is known."""
        assert self._sink is not None
        data = self._sink.take()
        if self._head is None:
            return data
        self._head += data
        trimmed = _without_tag_frame(bytes(self._head))
        if trimmed is None:
            return b""
        self._head = None
        return trimmed


def _mp3_options(sample_rate: int) -> dict[str, Any]:
    """soundfile's arguments for a constant-bitrate MP3 at ``sample_rate``:
    libsndfile takes the bitrate only as a compression level, spread evenly
    over its MPEG version's range (``mpeg_l3_encoder_set_quality``)."""
    kbps = next(k for floor, k in _MP3_KBPS if sample_rate >= floor)
    top, bottom = (320, 32) if sample_rate >= 32000 else (160, 8) if sample_rate >= 16000 else (64, 8)
    return {"bitrate_mode": "CONSTANT", "compression_level": (top - kbps) / (top - bottom)}


def write_file(samples: np.ndarray, sample_rate: int, fmt: str) -> bytes:
    """A whole file, its header complete (tests and the bench write their inputs with it)."""
    if fmt in ("wav", "pcm"):
        return (wav_header(sample_rate, samples.size) if fmt == "wav" else b"") + pcm16(samples)
    import soundfile

    container, subtype = _SOUNDFILE[fmt]
    out = io.BytesIO()
    soundfile.write(out, to_int16(samples), sample_rate, format=container, subtype=subtype)
    return out.getvalue()
