"""The export pipeline's bottom layer: what every stage shares.

- `errors`: the errors an export raises;
- `options`: `ExportOptions`, an export's arguments checked and resolved once;
- `modes`: the one table of quantize modes (`MODES`: each mode's policy),
  export dtypes and their defaults;
- `model`: what is asked of a model (is it one, its layers, its graph;
  `ModelFacts`, derived once per export);
- `names`: the signature names of a model's inputs and outputs;
- `precision`: the one half-precision test and the one rebuild of a model
  from its config with its weights (under another dtype policy, in float64;
  `float64_outputs`, the reference of the float64 re-checks);
- `metrics`: the error metrics, and the tolerances of the fold's and the
  float64 checks;
- `inputs`: the model's input structure, user data converted to it (the one
  parser), the one rule for what a check runs on (`inputs_to_check`), and
  the refusal of data that does not fit the file's shapes (`check_fits`);
- `shapes`: the shapes a file's inputs take (which dimensions stay
  dynamic); `second_shape`: the second shape a dynamic artifact is checked
  at;
- `staging`: atomic writes.
"""
