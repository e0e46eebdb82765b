"""Synthesised audio encoded as it is made: each chunk of samples out as
the bytes of its format as soon as it is encoded, for /v1/audio/speech to
stream. WAV and raw PCM are written here; FLAC and MP3 through libsndfile
(``soundfile``, which ships it), into a file whose bytes are taken as they
come (``_Sink``)."""

from __future__ import annotations

import io
import struct
from typing import Any

import numpy as np

from mlxd.engine.audio_files import SOUNDFILE, WRITE_FORMATS, pcm16, to_int16, wav_header

# MP3 at a constant bitrate, in kbps by the MPEG version the rate makes
# (MPEG-1 from 32 kHz, MPEG-2 from 16 kHz, MPEG-2.5 below; enough for
# speech in mono). A streamed MP3 has no Xing/Info frame (``_without_tag_frame``),
# and without one a reader takes the length from the first frame's
# bitrate and the file's size: libsndfile (mpg123) does, and soundfile
# reads that many samples, so a variable bitrate cut a 43 s file to 21 s.
_MP3_KBPS = ((32000, 64), (16000, 48), (0, 32))


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
            head = self._start()
        if self._file is None:
            return head + pcm16(samples)
        assert self._sink is not None
        # The same 16-bit samples as pcm and wav: libsndfile's own cast of
        # floats rounds where mlx-audio's truncates, and FLAC differed from
        # the pcm of the same request by a step in most samples.
        self._file.write(to_int16(samples))
        return self._taken()

    def close(self) -> bytes:
        """The encoder's last bytes (FLAC's and MP3's final frames); where no
        chunk came, a whole file of no audio (``_empty``)."""
        if not self._started:
            return self._empty()
        if self._file is None:
            return b""
        assert self._sink is not None
        self._file.close()
        self._file = None
        tail = self._taken()
        if self._head is not None:  # the stream ended while its head was undecided
            tail, self._head = bytes(self._head), None
        return tail

    def _start(self) -> bytes:
        """WAV's header, its length unknown; or libsndfile's file opened."""
        self._started = True
        if self.fmt == "wav":
            return wav_header(self.sample_rate)
        if self.fmt != "pcm":
            import soundfile

            container, subtype = SOUNDFILE[self.fmt]
            self._sink = _Sink()
            self._file = soundfile.SoundFile(self._sink, mode="w", samplerate=self.sample_rate, channels=1,
                                             format=container, subtype=subtype,
                                             **(_mp3_options(self.sample_rate) if self.fmt == "mp3" else {}))
            if self.fmt == "mp3":
                self._head = bytearray()
        return b""

    def _empty(self) -> bytes:
        """The file of a synthesis that made no sample. Nothing went out yet,
        so WAV's sizes are known: 0 (the unknown length's header claimed
        4 GB of nothing). libsndfile writes nothing at all for no samples,
        which no reader opens: FLAC is its header alone (``empty_flac``);
        MP3 has no header, and its shortest file is LAME's frames for one
        sample of silence (72 ms at 32 kHz, its delay and padding)."""
        if self.fmt == "wav":
            self._started = True
            return wav_header(self.sample_rate, 0)
        if self.fmt == "flac":
            self._started = True
            return empty_flac(self.sample_rate)
        return self.feed(np.zeros(1 if self.fmt == "mp3" else 0, np.float32)) + self.close()

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


def empty_flac(sample_rate: int) -> bytes:
    """A FLAC stream of no frames: the marker and a STREAMINFO block (the
    FLAC spec, RFC 9639 8.2) for 16-bit mono at ``sample_rate``, its block
    sizes libsndfile's 4,096, its frame sizes, total and MD5 unknown (0)."""
    rate_channels_bits_total = sample_rate << 44 | (1 - 1) << 41 | (16 - 1) << 36
    streaminfo = (struct.pack(">HH", 4096, 4096) + bytes(6) + rate_channels_bits_total.to_bytes(8, "big")
                  + bytes(16))
    last_block_of_type_0 = 0x80
    return b"fLaC" + bytes([last_block_of_type_0]) + len(streaminfo).to_bytes(3, "big") + streaminfo


def _mp3_options(sample_rate: int) -> dict[str, Any]:
    """soundfile's arguments for a constant-bitrate MP3 at ``sample_rate``:
    libsndfile takes the bitrate only as a compression level, spread evenly
    over its MPEG version's range (``mpeg_l3_encoder_set_quality``)."""
    kbps = next(k for floor, k in _MP3_KBPS if sample_rate >= floor)
    top, bottom = (320, 32) if sample_rate >= 32000 else (160, 8) if sample_rate >= 16000 else (64, 8)
    return {"bitrate_mode": "CONSTANT", "compression_level": (top - kbps) / (top - bottom)}
