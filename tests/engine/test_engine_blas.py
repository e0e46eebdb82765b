"""Which BLAS MLX runs on, checked in fresh processes with and without the preload."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mlxd.engine import blas

linux_with_openblas = pytest.mark.skipif(
    blas.find_openblas() is None, reason="needs Linux with Debian's libopenblas0 installed"
)

PROBE = (
    "import json; from mlxd.engine.blas import active_blas, blas_report;"
    "print(json.dumps({'active': active_blas(), 'report': blas_report()}))"
)


def probe(env: dict[str, str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", blas.ENV_SWITCH)}
    env.update(extra)
    return env


@linux_with_openblas
@pytest.mark.mlx
def test_preloaded_process_runs_mlx_on_openblas():
    env = blas.preload_env(clean_env())
    assert env is not None
    assert "libopenblas" in env["LD_PRELOAD"]
    seen = probe(env)
    assert seen["active"] == blas.OPENBLAS
    assert seen["report"]["warning"] is None


@linux_with_openblas
@pytest.mark.mlx
def test_process_without_preload_runs_the_bundled_blas_and_warns():
    seen = probe(clean_env())
    assert seen["active"] == blas.BUNDLED
    assert "bundled reference BLAS" in seen["report"]["warning"]


@linux_with_openblas
def test_no_reexec_when_already_preloaded_or_switched_off():
    once = blas.preload_env(clean_env())
    assert once is not None
    assert blas.preload_env(once) is None
    assert blas.preload_env(clean_env(MLXD_BLAS="bundled")) is None


@linux_with_openblas
def test_existing_preloads_are_kept():
    env = blas.preload_env(clean_env(LD_PRELOAD="/usr/lib/libfoo.so"))
    assert env is not None
    assert env["LD_PRELOAD"].split(":") == [str(blas.find_openblas()), "/usr/lib/libfoo.so"]


def test_unknown_blas_mode_is_a_config_error():
    from mlxd.errors import ConfigError

    with pytest.raises(ConfigError, match="MLXD_BLAS"):
        blas.preload_env(clean_env(MLXD_BLAS="fast"))


@linux_with_openblas
@pytest.mark.mlx
def test_no_slow_blas_warning_where_matmuls_run_on_a_gpu():
    # The same process state (bundled BLAS mapped) as the test above: on CUDA
    # the matrix products run on the GPU, so the warning would only mislead.
    code = ("import json; from mlxd.engine.blas import blas_report;"
            "print(json.dumps([blas_report(device_kind=k)['warning'] for k in ('cuda', 'cpu')]))")
    done = subprocess.run([sys.executable, "-c", code], env=clean_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    on_cuda, on_cpu = json.loads(done.stdout)
    assert on_cuda is None and "bundled reference BLAS" in on_cpu
