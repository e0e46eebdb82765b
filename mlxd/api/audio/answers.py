"""The answers of the transcription routes in each ``response_format``
(json, text, verbose_json, srt, vtt) and their stream events."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from starlette.responses import Response

from mlxd.engine.audio import Window


def transcript_text(windows: Sequence[Window]) -> str:
    return "".join(w.text for w in windows).strip()


def _segments(windows: Sequence[Window]) -> list[dict[str, Any]]:
    out = []
    for w in windows:
        for seg in w.segments:
            out.append({
                "id": len(out), "seek": int(seg.get("seek", 0)), "start": round(seg["start"], 3),
                "end": round(seg["end"], 3), "text": seg.get("text", ""), "tokens": list(seg.get("tokens", [])),
                "temperature": float(seg.get("temperature", 0.0)),
                "avg_logprob": _number(seg.get("avg_logprob")),
                "compression_ratio": _number(seg.get("compression_ratio")),
                "no_speech_prob": _number(seg.get("no_speech_prob")),
            })
    return out


def _number(value: Any) -> float:
    """JSON has no NaN; a random or float16 model can give one."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return 0.0
    return v if v == v and abs(v) != float("inf") else 0.0


def _words(windows: Sequence[Window]) -> list[dict[str, Any]]:
    return [{"word": w["word"].strip(), "start": round(w["start"], 3), "end": round(w["end"], 3)}
            for win in windows for seg in win.segments for w in seg.get("words") or ()]


def _stamp(seconds: float, separator: str) -> str:
    ms = max(0, int(round(seconds * 1000)))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{separator}{ms:03d}"


def srt(windows: Sequence[Window]) -> str:
    blocks = [f"{i}\n{_stamp(s['start'], ',')} --> {_stamp(s['end'], ',')}\n{s['text'].strip()}\n"
              for i, s in enumerate(_segments(windows), 1)]
    return "\n".join(blocks)


def vtt(windows: Sequence[Window]) -> str:
    blocks = [f"{_stamp(s['start'], '.')} --> {_stamp(s['end'], '.')}\n{s['text'].strip()}\n"
              for s in _segments(windows)]
    return "WEBVTT\n\n" + "\n".join(blocks)


def transcript(windows: Sequence[Window], response_format: str, *, task: str, language: str | None,
               duration: float, granularities: Sequence[str]) -> Response:
    if response_format == "text":
        return Response(transcript_text(windows) + "\n", media_type="text/plain; charset=utf-8")
    if response_format == "srt":
        return Response(srt(windows), media_type="text/plain; charset=utf-8")
    if response_format == "vtt":
        return Response(vtt(windows), media_type="text/vtt; charset=utf-8")
    body: dict[str, Any] = {"text": transcript_text(windows)}
    if response_format == "verbose_json":
        detected = next((w.language for w in windows if w.language), None)
        body = {"task": task, "language": _language_name(language or detected), "duration": round(duration, 3),
                **body}
        if not granularities or "segment" in granularities:
            body["segments"] = _segments(windows)
        if "word" in granularities:
            body["words"] = _words(windows)
    else:
        body["usage"] = {"type": "duration", "seconds": int(round(duration))}
    return Response(json.dumps(body, ensure_ascii=False), media_type="application/json")


def _language_name(code: str | None) -> str:
    """OpenAI names the language in words ("english")."""
    if not code:
        return ""
    from mlx_audio.stt.models.whisper.tokenizer import LANGUAGES

    return LANGUAGES.get(code, code)


def delta_event(text: str) -> bytes:
    return _sse({"type": "transcript.text.delta", "delta": text})


def done_event(text: str, duration: float) -> bytes:
    return _sse({"type": "transcript.text.done", "text": text,
                 "usage": {"type": "duration", "seconds": int(round(duration))}})


def error_event(body: dict[str, Any]) -> bytes:
    return _sse({"type": "error", **body})


def _sse(event: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(event, ensure_ascii=False)}\n\n".encode()
