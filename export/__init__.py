"""The export benchmarks: `to_tflite` / `to_saved_model` files measured on
this machine (not part of the package).

Run each from the repository root as a module, e.g.
`python -m export.bench_ondevice --quick`; export/README.md lists them and
their tables. Every table is printed with `benchmarks.machine.header()`.
"""
