"""The TFLite format: its public door (`export.to_tflite`) and its writer
(`write`), with the converter options and calibration feed (`converter`),
the 16x8 rewrites (`int16`), conversion errors explained (`explain`) and
the fast int8 quantization (`selective`, `step_int8`)."""
