"""Exactly one MLX backend per machine."""

from __future__ import annotations

import sys

import pytest

from mlxd.engine.mlx_backend import backend_problem, installed_backends


def test_backends_are_found_among_installed_distributions():
    assert installed_backends(["mlx", "mlx_cpu", "fastapi"]) == ["mlx-cpu"]
    assert installed_backends(["mlx", "mlx-cuda-13", "mlx-cpu"]) == ["mlx-cpu", "mlx-cuda-13"]
    assert installed_backends(["mlx", "mlx-metal"]) == []


@pytest.mark.parametrize(
    "platform, backends, says",
    [
        ("linux", ["mlx-cpu"], None),
        ("linux", ["mlx-cuda-13"], None),
        ("darwin", [], None),
        ("linux", [], "pip install 'mlxd[cpu]'"),
        ("linux", ["mlx-cpu", "mlx-cuda-13"], "pip uninstall mlx-cpu"),
    ],
)
def test_the_backend_check(platform, backends, says):
    problem = backend_problem(platform, backends)
    assert (problem is None) if says is None else (says in problem)


def test_this_environment_has_exactly_one():
    assert backend_problem(sys.platform, installed_backends()) is None


def test_the_cuda_extra_does_not_also_pull_the_cpu_backend():
    # Environment markers cannot see extras: a Linux-wide mlx[cpu] dependency
    # would be installed together with mlx[cuda13].
    import tomllib
    from pathlib import Path

    from packaging.requirements import Requirement

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    linux = {"sys_platform": "linux", "platform_system": "Linux", "extra": ""}
    base = [Requirement(r) for r in project["dependencies"]]
    base_mlx = [r for r in base if r.name == "mlx" and (r.marker is None or r.marker.evaluate(linux))]
    assert base_mlx and all(not r.extras for r in base_mlx)
    extras = project["optional-dependencies"]
    assert [Requirement(r).extras for r in extras["cpu"]] == [{"cpu"}]
    assert [Requirement(r).extras for r in extras["cuda"]] == [{"cuda13"}]
