"""Where a CPU cold start goes (#24 item 12): the first request through a
freshly started `mlxd serve` against plain mlx-lm loading and answering in a
fresh process, each broken into its steps, with mlxd's warm-up before and
after its cut, all in one run (alternating, fresh processes, the kernel
cache as the machine has it).

- mlx-lm, a fresh process: `import mlx_lm`, `mlx_lm.load`, the chat
  template and the first token of one streamed greedy answer.
- mlxd, a fresh process each: spawn to /health (Python, `import mlxd`, the
  registry, the app; its own figures from an in-process probe of the same
  code), then the first chat request, which loads the model: the
  background `import mlx_lm` it waits for, the weights, the warm-up, and the
  first token after the load. "before" runs the mlxd of ``--before`` (a
  commit, unpacked with `git archive` into a temporary folder), "after"
  this tree's.

    python bench/cold_breakdown.py                 # SmolLM2 float32, 2 rounds
    python bench/cold_breakdown.py --rounds 3 --before afc11df

Cold start = spawn to first token; the target is mlxd / mlx-lm <= 1.2.
Prints the table and merges the figures into bench/results/cold_breakdown.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402
import yaml  # noqa: E402

from bench.common import ROOT, daemon, environment, save, table  # noqa: E402
from bench.prefix_cache import stream_chat  # noqa: E402

QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]
MAX_TOKENS = 4

DIRECT = """
import json, sys, time
marks = {}
t = time.perf_counter(); import mlx_lm; marks["import_mlx_lm_s"] = time.perf_counter() - t
t = time.perf_counter(); model, tokenizer = mlx_lm.load(sys.argv[1]); marks["weights_s"] = time.perf_counter() - t
t = time.perf_counter()
prompt = tokenizer.apply_chat_template(json.loads(sys.argv[2]), add_generation_prompt=True)
for response in mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens=1):
    pass
marks["first_token_s"] = time.perf_counter() - t
print(json.dumps(marks))
"""

# What `mlxd serve` does before it answers /health, timed step by step.
PROBE = """
import json, sys, time
marks = {}
t = time.perf_counter(); import mlxd.cli.main; marks["import_mlxd_s"] = time.perf_counter() - t
from mlxd.registry.loader import load_registry
t = time.perf_counter(); load_registry(sys.argv[1]); marks["registry_s"] = time.perf_counter() - t
print(json.dumps(marks))
"""


def smollm2_f32() -> Path:
    from mlxd.factory.smollm2 import smollm2_gguf
    from mlxd.gguf.cache import converted_dir

    return converted_dir(smollm2_gguf(), Path.home() / ".cache" / "mlxd", dtype="float32")


def unpack(commit: str, into: Path) -> Path:
    """``commit``'s mlxd package, as `git archive` gives it (no work tree touched)."""
    archive = into / "before.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), commit, "mlxd"], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "src", filter="data")
    return into / "src"


def libraries(*first: Path) -> str:
    """PYTHONPATH without this checkout (each side imports its own mlxd, or
    none), keeping where the libraries are (the GPU kit puts them there)."""
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and Path(p).resolve() != ROOT.resolve()]
    return os.pathsep.join([*(str(f) for f in first), *kept])


def direct(path: Path) -> dict[str, float]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", DIRECT, str(path), json.dumps(QUESTION)], capture_output=True,
                          text=True, timeout=900, env={**os.environ, "PYTHONPATH": libraries()})
    total = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    marks = json.loads(done.stdout.strip().splitlines()[-1])
    marks["python_start_s"] = total - sum(marks.values())
    return {**{k: round(v, 3) for k, v in marks.items()}, "cold_start_s": round(total, 3)}


def probe(source: Path, registry: Path) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", PROBE, str(registry)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": libraries(source)}, cwd=source)
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    return {k: round(v, 3) for k, v in json.loads(done.stdout.strip().splitlines()[-1]).items()}


def through_mlxd(entry: dict[str, Any], source: Path, logs: Path, label: str) -> dict[str, Any]:
    env = {"PYTHONPATH": libraries(source)}
    log_to = logs / f"{label}.log"
    started = time.perf_counter()
    with daemon([entry], env=env, log_to=log_to, cwd=source) as url:
        healthy = time.perf_counter() - started
        with httpx.Client(base_url=url, timeout=900) as http:
            reply = stream_chat(http, "m", QUESTION, MAX_TOKENS)
            first = time.perf_counter() - started
            status = next(m for m in http.get("/v1/status").json()["models"] if m["name"] == "m")
    engine = status["engine"]
    warmup = engine.get("warmup") or {}
    load = status["last_load_seconds"] or 0.0
    imported = _imported(log_to.read_text())
    weights = engine.get("load_seconds")
    return {
        "to_health_s": round(healthy, 3),
        "import_mlx_lm_s": imported,
        "load_s": round(load, 3),
        "weights_s": weights,
        "warmup_s": warmup.get("seconds"),
        "warmup_requests": warmup.get("requests"),
        # "background": the first request did not wait for it (its figures stay 0 until it is done).
        "warmup_mode": warmup.get("mode"),
        # What the load spent besides the weights and the warm-up (waiting
        # for the background import, the prefix cache's restore, the engine).
        "load_other_s": round(load - (weights or 0) - (warmup.get("seconds") or 0), 3),
        "first_token_after_load_s": round(reply["ttft_s"] - load, 3),
        "cold_start_s": round(first, 3),
        "text": reply["text"],
    }


def _imported(log: str) -> float | None:
    found = re.search(r"imported mlx_lm in ([0-9.]+)s", log)
    return float(found.group(1)) if found else None


def median(runs: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in runs if isinstance(r.get(key), (int, float))]
    return round(statistics.median(values), 3) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--before", default="afc11df",
                        help="the commit whose mlxd is 'before' ('': none, as on a machine without the history)")
    args = parser.parse_args()
    path = smollm2_f32()
    # The demo's default entry: SmolLM2 at two slots, its trained context.
    entry = {"name": "m", "path": str(path), "max_context": 8192, "max_concurrency": 2, "idle_unload_seconds": 0}
    with tempfile.TemporaryDirectory(prefix="mlxd-cold-") as tmp:
        tmp_path = Path(tmp)
        sources = {**({"before": unpack(args.before, tmp_path)} if args.before else {}), "after": ROOT}
        registry = tmp_path / "models.yaml"
        registry.write_text(yaml.safe_dump({"manager": {"memory_budget": "70%"}, "models": [entry]}))
        logs = tmp_path / "logs"
        logs.mkdir()
        runs: dict[str, list[dict[str, Any]]] = {"mlx-lm": [], **{label: [] for label in sources}}
        probes: dict[str, list[dict[str, Any]]] = {label: [] for label in sources}
        loads = []
        for number in range(args.rounds):
            loads.append(os.getloadavg()[0])
            runs["mlx-lm"].append(direct(path))
            for label, source in sources.items():
                runs[label].append(through_mlxd(entry, source, logs, f"{label}-{number}"))
                probes[label].append(probe(source, registry))
            print(f"round {number + 1}: " + ", ".join(f"{k} {v[-1]['cold_start_s']}s" for k, v in runs.items()),
                  flush=True)
        loads.append(os.getloadavg()[0])
    steps = [
        ("Python start", "python_start_s", None),
        ("import mlx_lm", "import_mlx_lm_s", "import_mlx_lm_s"),
        ("import mlxd", None, "import_mlxd_s"),
        ("registry", None, "registry_s"),
        ("spawn to /health", None, "to_health_s"),
        ("weights", "weights_s", "weights_s"),
        ("warm-up", None, "warmup_s"),
        ("rest of the load", None, "load_other_s"),
        ("first token (after the load)", "first_token_s", "first_token_after_load_s"),
        ("cold start: spawn to first token", "cold_start_s", "cold_start_s"),
    ]
    merged = {label: [{**r, **p} for r, p in zip(runs[label], probes[label])] for label in probes}
    rows = []
    for name, direct_key, mlxd_key in steps:
        rows.append([name, median(runs["mlx-lm"], direct_key) if direct_key else "",
                     *(median(merged[label], mlxd_key) if mlxd_key else "" for label in merged)])
    direct_cold = median(runs["mlx-lm"], "cold_start_s")
    ratios = {label: round(median(merged[label], "cold_start_s") / direct_cold, 2) for label in merged}
    rows.append(["cold start ÷ mlx-lm", 1, *(ratios[label] for label in merged)])
    rows.append(["warm-up requests", "", *(median(merged[label], "warmup_requests") for label in merged)])
    rows.append(["warm-up ran", "", *("/".join(sorted({str(r.get("warmup_mode")) for r in merged[label]}))
                                      for label in merged)])
    device = environment().get("device", {}).get("kind", "cpu")
    print(f"\nSmolLM2-135M float32 on the {device.upper()}, medians of {args.rounds} rounds, "
          f"load average {min(loads):.1f}-{max(loads):.1f} (`uptime`)")
    columns = {"before": f"mlxd before ({args.before})", "after": "mlxd after"}
    print(table(["step", "mlx-lm", *(columns[label] for label in merged)], rows))
    print("(mlxd imports mlx_lm in the background from its start; the load waits for what is left of it)")
    result = {"rounds": args.rounds, "before": args.before, "load_average": [min(loads), max(loads)],
              "runs": {"mlx-lm": runs["mlx-lm"], **merged}, "ratios": ratios, **environment()}
    print(f"wrote {save('cold_breakdown', f'smollm2-float32-{device}', result).relative_to(ROOT)}")


if __name__ == "__main__":
    main()
