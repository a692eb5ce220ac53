"""Stage 3: the one verifier (`verifier`), the artifacts run (`run`), and
`Verification`, what a check reports (`verification`)."""
