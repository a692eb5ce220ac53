"""The signature names of a model's inputs and outputs (`names`), the one
signature key every artifact carries."""
