"""GGUF quantized weights on the CPU, held as their blocks (issue 22): the record
(`blocks`), numba decode kernels over it (`kernels`, `products`) and the tiled prefill (`prefill`).
docs/QUANT_KERNELS.md has the measurements behind each choice."""
