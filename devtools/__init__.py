"""Development tools: benchmarks (``python -m devtools.bench``, ``versus``, ``turns``, probes), load and
overload runs, fault drills. No product module imports this package (checked by
``tests/unit/test_architecture.py``)."""
