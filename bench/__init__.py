"""Benchmarks for sojourn (not tests: nothing here asserts; it measures and prints).

``python -m bench.foundation`` measures the runtime's core costs against raw JetStream on the
same server; see docs/benchmarks.md.
"""
