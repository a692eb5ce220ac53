"""The export pipeline's bottom layer: what every stage shares.

- `errors`: the errors an export raises;
- `modes`: the quantize modes, export dtypes and their defaults;
- `model`: what is asked of a model (is it one, its layers, its graph);
- `names`: the signature names of a model's inputs and outputs;
- `precision`: the one half-precision test and the one rebuild of a model
  from its config with its weights (under another dtype policy, in float64);
- `metrics`: the error metrics and tolerances every check compares with;
- `inputs`: the model's input structure, and user data converted to it;
- `staging`: atomic writes.
"""
