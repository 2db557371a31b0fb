"""Load benchmarks for x402-gateway (not tests): ``python bench/run.py [--quick]``."""
