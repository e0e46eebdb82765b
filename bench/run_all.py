"""Run every benchmark at a size that finishes in minutes on a laptop CPU.

    python bench/run_all.py            # small sizes
    python bench/run_all.py --full     # the realistic `bench` size where it matters

Each script prints its own table and writes bench/results/<name>.json.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

QUICK = [
    ["overhead.py", "--size", "tiny"],
    ["overhead.py", "--size", "small"],
    ["overhead.py", "--model", "smollm2"],
    ["residency.py", "--size", "small"],
    ["concurrency.py", "--size", "small"],
    ["prefix_cache.py", "--size", "small"],
    ["agent_families.py", "--families", "qwen3", "gemma3_text", "qwen3_next", "gpt_oss"],
    ["status_latency.py"],
    ["constrained.py", "--size", "tiny"],
    ["constrained.py", "--size", "small"],
    ["remote.py", "--size", "tiny"],
    ["servers.py", "--sizes", "tiny", "small"],
    ["stream_cost.py"],
    ["demo_dtype.py", "--rounds", "1", "--tokens", "16", "--repeats", "1"],
]
FULL = [
    ["overhead.py", "--size", "bench"],
    ["residency.py", "--size", "bench", "--repeats", "3"],
    ["concurrency.py", "--size", "bench"],
    ["prefix_cache.py", "--size", "bench"],
    ["servers.py", "--sizes", "bench"],
    ["demo_dtype.py", "--rounds", "3"],
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--full", action="store_true", help="also run the realistic `bench` size")
    args = parser.parse_args()
    failed = []
    for command in QUICK + (FULL if args.full else []):
        script = HERE / command[0]
        if not script.exists():
            print(f"(skipping {command[0]}: not present)")
            continue
        print(f"\n=== {' '.join(command)}", flush=True)
        if subprocess.run([sys.executable, str(script), *command[1:]]).returncode != 0:
            failed.append(" ".join(command))
    if failed:
        print("\nfailed: " + "; ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
