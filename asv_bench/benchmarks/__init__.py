"""segstore's airspeed velocity (asv 0.6) benchmark suite.

Run from ``asv_bench/``: ``asv run --python=same --quick --show-stderr`` smoke-runs every
benchmark once in the current environment (``make bench``); ``make bench-full`` measures.
Shared data generation lives in :mod:`.common`.
"""
