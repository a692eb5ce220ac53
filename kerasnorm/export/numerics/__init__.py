"""Numbers and their failures: the error metrics and the tolerances of the
fold's and the float64 checks (`metrics`); the one half-precision test and
the one rebuild of a model from its config with its weights (`precision`,
`float64_outputs`); the errors an export raises (`errors`)."""
