"""Export: TFLite conversion and LiteRT parity checks (grows with issue 5)."""
