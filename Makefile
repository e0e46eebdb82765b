# The two entry points a newcomer needs; both set up .venv first.
.PHONY: demo test setup bench

setup:
	@scripts/setup.sh

demo: setup
	.venv/bin/mlxd serve

test:
	@scripts/setup.sh --tests
	.venv/bin/python scripts/with_openblas.py -m pytest -n auto --dist loadfile

bench: setup
	.venv/bin/python bench/run_all.py
