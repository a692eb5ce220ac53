"""Stage 2 for TFLite: converter options and calibration feed (`options`),
the 16x8 rewrites (`int16`), conversion errors explained (`explain`), and the
writer (`write`)."""
