"""Benchmarks: ``python -m bench`` runs every ``bench/bench_*.py`` case side by side with its reference."""
