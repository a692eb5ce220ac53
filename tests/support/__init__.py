"""Test support: numpy references, the layer-test helper, the table of
public-class cases, backend probes and the subprocess scripts."""
