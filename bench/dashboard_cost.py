"""What the dashboard costs the daemon while it is open: a real headless
Chromium on the page at its default 2 s refresh (status, activity table and
history charts) against a `mlxd serve` process on two tiny models, with a
request now and then so the tables and charts have something to show. The
daemon's CPU time over the run (psutil) is compared with the same run with
no page open. The target is under 1 % of one core.

    python bench/dashboard_cost.py [--seconds 60]

Prints a table and writes bench/results/dashboard_cost.json. Timing only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402
import psutil  # noqa: E402

from bench.common import PROMPT, daemon, save, table  # noqa: E402

TARGET_PERCENT = 1.0


def _daemon_process(url: str) -> psutil.Process:
    port = url.rsplit(":", 1)[1]
    for child in psutil.Process().children(recursive=True):
        if "serve" in child.cmdline() and port in child.cmdline():
            return child
    raise RuntimeError("the daemon process was not found")


def _browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    profile = tempfile.mkdtemp(prefix="mlxd-bench-chromium-")
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", f"--user-data-dir={profile}",
                 "--disable-background-networking", "--window-size=1280,1000"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


def _phase(url: str, seconds: float, with_page: bool) -> dict[str, float]:
    process = _daemon_process(url)
    driver = _browser() if with_page else None
    try:
        if driver is not None:
            driver.get(f"{url}/")  # the default 2 s refresh
            time.sleep(3)
        requests = 0
        cpu0, t0 = process.cpu_times(), time.monotonic()
        while time.monotonic() - t0 < seconds:
            # One short request every 10 s: something to show, little to pay.
            httpx.post(f"{url}/v1/completions", json={"model": "first", "prompt": PROMPT, "max_tokens": 8}, timeout=60)
            requests += 1
            time.sleep(max(0.0, min(10.0, seconds - (time.monotonic() - t0))))
        cpu1, t1 = process.cpu_times(), time.monotonic()
    finally:
        if driver is not None:
            driver.quit()
    used = (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system)
    return {"seconds": round(t1 - t0, 1), "cpu_seconds": round(used, 3), "percent_of_a_core": round(100 * used / (t1 - t0), 3),
            "requests": requests}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    from mlxd.factory import ModelRecipe, build_model

    models = [
        {"name": "first", "path": str(build_model(ModelRecipe("qwen2", "tiny", seed=0, dtype="float32")))},
        {"name": "second", "path": str(build_model(ModelRecipe("llama", "tiny", seed=1, dtype="float32")))},
    ]
    with daemon(models) as url:
        httpx.post(f"{url}/v1/completions", json={"model": "first", "prompt": PROMPT, "max_tokens": 8}, timeout=120)
        without = _phase(url, args.seconds, with_page=False)
        with_page = _phase(url, args.seconds, with_page=True)
    added = round(with_page["percent_of_a_core"] - without["percent_of_a_core"], 3)
    result = {"without_page": without, "with_page": with_page, "page_adds_percent_of_a_core": added,
              "target_percent": TARGET_PERCENT, "load": os.getloadavg()}
    rows = [[name, r["seconds"], r["cpu_seconds"], r["percent_of_a_core"], r["requests"]]
            for name, r in (("no page", without), ("dashboard open, 2 s refresh", with_page))]
    print(table(["phase", "seconds", "daemon CPU s", "% of a core", "requests"], rows))
    print(f"the open page adds {added} % of a core (target < {TARGET_PERCENT} %)")
    print(f"wrote {save('dashboard_cost', 'default', result)}")


if __name__ == "__main__":
    main()
