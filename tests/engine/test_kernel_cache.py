"""MLX's compiled-kernel cache lives under mlxd's cache folder, not in /tmp."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mlxd.engine.cuda_attention import CUDNN_SDPA_ENV, attention_env
from mlxd.engine.kernel_cache import PTX_ENV, kernel_cache_env

HOME = Path("/home/u")


def test_the_ptx_cache_goes_under_mlxd_cache_per_mlx_version():
    assert kernel_cache_env({}, HOME, "0.32.4") == {PTX_ENV: "/home/u/.cache/mlxd/kernels/mlx-0.32.4/ptx"}
    assert kernel_cache_env({"XDG_CACHE_HOME": "/xdg"}, HOME, "0.33.0") == {
        PTX_ENV: "/xdg/mlxd/kernels/mlx-0.33.0/ptx"}
    assert kernel_cache_env({"MLXD_KERNEL_CACHE_DIR": "/fast/k"}, HOME, "0.32.4") == {
        PTX_ENV: "/fast/k/mlx-0.32.4/ptx"}


def test_a_folder_the_user_chose_is_kept():
    assert kernel_cache_env({PTX_ENV: "/mine"}, HOME, "0.32.4") == {}


def test_the_mlxd_command_sets_it_before_mlx_is_imported(tmp_path):
    # `mlxd --help` runs main(); the probe checks the variable and that MLX
    # was not imported before it was set.
    code = ("import os, sys; from mlxd.cli import main as cli; sys.argv=['mlxd','--help'];\n"
            "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
            "print(os.environ.get('MLX_PTX_CACHE_DIR')); print(os.environ.get('MLX_CUDA_USE_CUDNN_SDPA'));"
            "print('mlx.core' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k not in (PTX_ENV, CUDNN_SDPA_ENV)}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    *_, folder, cudnn_attention, mlx_imported = done.stdout.strip().splitlines()
    assert folder.startswith(str(tmp_path / "mlxd" / "kernels" / "mlx-")) and folder.endswith("/ptx")
    assert cudnn_attention == "0"  # MLX's own prefill attention (mlxd.engine.cuda_attention)
    assert mlx_imported == "False"


def test_cudnn_attention_is_off_unless_the_user_asked_for_it():
    assert attention_env({}) == {CUDNN_SDPA_ENV: "0"}
    assert attention_env({CUDNN_SDPA_ENV: "1"}) == {}
