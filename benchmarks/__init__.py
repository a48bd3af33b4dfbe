"""The performance suite: `python -m benchmarks` (BENCHMARKS.md has the current figures).

Benchmarks, not tests: nothing here asserts a speed. Each figure is measured
against a baseline taken in the same run, so the ratios mean something on a
noisy machine where the absolute numbers do not.
"""
