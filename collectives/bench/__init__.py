"""Benchmarks and checks on :mod:`collectives.jobs`: nccl-tests' tables
(:mod:`~collectives.bench.nccl`), the checks of every op against numpy
(:mod:`~collectives.bench.checks`), and how fast virtual time runs
(:mod:`~collectives.bench.virtual`)."""
