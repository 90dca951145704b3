"""GGUF quantized weights on the CPU, held as their blocks: the record
(`blocks`), numba decode kernels over it (`products` runs them: `kernels`, and `vector` with its LLVM IR in
`vector_ir` and `int8_ir`) and the tiled prefill (`prefill`).
docs/QUANT_KERNELS.md has the measurements behind each choice."""
