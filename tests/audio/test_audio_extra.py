"""What `pip install mlxd[audio]` must bring for the audio routes to work on
a machine without the other extras (mlx-vlm happens to bring some of it)."""

import tomllib
from pathlib import Path

from packaging.requirements import Requirement


def test_the_audio_extra_brings_what_reading_an_uploaded_file_needs():
    # Without python-multipart, Starlette cannot parse a transcription's
    # upload and every one is a 400 (found on a GPU host without mlx-vlm).
    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["project"]
    audio = {Requirement(r).name for r in project["optional-dependencies"]["audio"]}
    assert {"mlx-audio", "miniaudio", "soundfile", "python-multipart"} <= audio
