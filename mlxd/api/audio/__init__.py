"""The speech routes (docs/audio.md): OpenAI's /v1/audio/transcriptions,
/v1/audio/translations and /v1/audio/speech, and /v1/audio/voices, adapters
over one request path (``path.py``) into the audio engines
(``mlxd.engine.audio``)."""
