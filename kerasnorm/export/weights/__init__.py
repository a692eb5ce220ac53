"""Integer weights written into a converted flatbuffer, shared by the
formats that write them (`to_tflite`, `to_litert_lm`): the weights pass
(`quantize`), its integers (`int_weights`) and lookups (`lookups`), the
file read and written with its weights in place (`buffers`), and a model
Keras quantized traced in float from its own integers (`keras_quantized`).
"""
