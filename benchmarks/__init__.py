"""The repository's speed benchmarks and profiles (not part of the package).

Run each from the repository root as a module, e.g.
`python -m benchmarks.bench_norms --quick`; docs/benchmarks.md lists them.
The export benchmarks are the sibling package `export/` (export/README.md).
Shared by both: `benchmarks.machine` (the machine and stack every table is
printed with) and `benchmarks.timing` (side-by-side interleaved medians).
"""
