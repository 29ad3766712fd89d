"""Warren's benchmarks: ``python -m bench [name ...]`` runs ``bench/bench_<name>.py``."""
