"""A speculating model's first requests compile no kernel once it is warm.

On this CPU MLX compiles a kernel per fused operation on first use (about
0.5 s each) and keeps it on disk; the CPU warm-up runs no verify step (its
kernels are per operation, not per shape: engine/warmup.py), so this checks
that the verify path (drafts kept, drafts rejected, rows rolled back, alone
and in a batch; by prompt lookup and by a draft model, whose own steps the
warm-up does not run either) needs none that plain decoding has not compiled."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from support.daemon import daemon_process, write_registry
from support.kernel_cache import KernelCache

pytestmark = pytest.mark.mlx

SEED = "def parse_arguments(argv):\n    parser = argparse.ArgumentParser("


def rendered(doc: dict) -> str:
    """`mlxd status` as a terminal of 120 columns shows ``doc``."""
    import io

    from rich.console import Console

    from mlxd.cli.status import render

    out = io.StringIO()
    Console(file=out, width=120, color_system=None).print(render(doc, 120))
    return out.getvalue()


METHODS = {
    "prompt_lookup": {"method": "prompt_lookup", "tokens": 4},
    # The same weights as the draft: most drafts are kept, the rest rolled back in the draft's cache too.
    "draft": {"method": "draft", "tokens": 3, "draft_model": "drafter"},
}


@pytest.mark.parametrize(("method", "concurrency"), [("prompt_lookup", 1), ("prompt_lookup", 3), ("draft", 3)])
def test_a_speculating_model_compiles_no_kernel_after_the_warmup(tmp_path, method, concurrency):
    from mlxd.factory.zoo_build import build_family

    kernels = KernelCache(tmp_path / "tmp")
    path = str(build_family("qwen3"))
    registry = write_registry(tmp_path, [
        {"name": "lookup", "path": path, "max_concurrency": concurrency,
         # auto_off: false: random weights' drafts may not pay on a loaded machine; they must be verified.
         "speculative": {**METHODS[method], "auto_off": False}},
        {"name": "drafter", "path": path}])
    with daemon_process(registry, tmp_path, "--no-watch", env=kernels.env) as d:
        assert httpx.post(f"{d.url}/v1/models/lookup/load", json={}, timeout=120).status_code == 200
        warm = kernels.compiled()
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
        # The counts behind the rates, in status and /metrics alike.
        drafted, kept = speculative["drafted_tokens"], speculative["accepted_tokens"]
        assert 0 < kept < drafted and speculative["verify_steps"] > 0, speculative
        assert abs(kept / drafted - speculative["acceptance_rate"]) < 1e-9, speculative
        metrics = httpx.get(f"{d.url}/metrics", timeout=30).text
        # `mlxd status` says it too, in a line of its own.
        shown = rendered(httpx.get(f"{d.url}/v1/status", timeout=30).json())
        lines = shown.splitlines()
        line = lines[lines.index("speculation") + 1]
        assert line.split()[0] == "lookup", shown
        assert f"{METHODS[method]['method']} K=" in line and " on " in line, shown
        assert f"kept {kept}/{drafted} drafts, {speculative['verify_steps']} steps" in line, shown
        assert f'mlxd_speculative_drafted_tokens_total{{model="lookup"}} {float(drafted)}' in metrics
        assert f'mlxd_speculative_accepted_tokens_total{{model="lookup"}} {float(kept)}' in metrics
        assert kernels.compiled() - warm == set()
