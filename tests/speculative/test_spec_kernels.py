"""A speculating model's first requests compile no kernel once it is warm.

On this CPU MLX compiles a kernel per fused operation on first use (about
0.5 s each) and keeps it on disk; the CPU warm-up runs no verify step (its
kernels are per operation, not per shape: engine/warmup.py), so this checks
that the verify path (drafts kept, drafts rejected, rows rolled back, alone
and in a batch) needs none that plain decoding has not compiled."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from support.daemon import daemon_process, write_registry

pytestmark = pytest.mark.mlx

SEED = "def parse_arguments(argv):\n    parser = argparse.ArgumentParser("


def cpu_kernels(tmp: Path) -> set[str]:
    return {p.name for p in tmp.rglob("*.so")}


@pytest.mark.parametrize("concurrency", [1, 3])
def test_prompt_lookup_compiles_no_kernel_after_the_warmup(tmp_path, concurrency):
    from mlxd.factory.zoo_build import build_family

    kernels = tmp_path / "tmp"
    kernels.mkdir()
    registry = write_registry(tmp_path, [{
        "name": "lookup", "path": str(build_family("qwen3")), "max_concurrency": concurrency,
        # auto_off: false: random weights' drafts may not pay on a loaded machine; they must be verified.
        "speculative": {"method": "prompt_lookup", "tokens": 4, "auto_off": False}}])
    env = {"TMPDIR": str(kernels), "MLX_PTX_CACHE_DIR": str(kernels / "ptx")}
    with daemon_process(registry, tmp_path, "--no-watch", env=env) as d:
        assert httpx.post(f"{d.url}/v1/models/lookup/load", json={}, timeout=120).status_code == 200
        warm = cpu_kernels(kernels)
        assert warm, "the warm-up compiled its kernels under TMPDIR"

        def complete(prompt: str, temperature: float = 0) -> str:
            reply = httpx.post(f"{d.url}/v1/completions", timeout=300, json={
                "model": "lookup", "prompt": prompt, "max_tokens": 48, "temperature": temperature,
                "ignore_eos": True})
            assert reply.status_code == 200, reply.text
            assert reply.json()["usage"]["completion_tokens"] == 48
            return reply.json()["choices"][0]["text"]

        # A prompt, the model's answer and the prompt again, twice: the
        # answer to that mostly repeats the first, so lookup's drafts are
        # kept in part (as a coding agent's edit repeats its file).
        seeds = [f"{SEED}{n}" for n in range(concurrency)]
        prompts = [seed + complete(seed) + "\n" + seed for seed in seeds]
        prompts = [seed + complete(prompt) + "\n" + seed for seed, prompt in zip(seeds, prompts)]
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(lambda n: complete(prompts[n], [0, 0.7][n % 2]), range(concurrency)))

        speculative = d.model("lookup")["speculative"]
        assert 0 < speculative["acceptance_rate"] < 1, speculative
        assert cpu_kernels(kernels) - warm == set()
