"""``python -m asyncgraph bench`` and the harness the scripts under ``benchmarks/`` share."""
