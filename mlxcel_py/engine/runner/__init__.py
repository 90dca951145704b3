"""The `Runner` Protocol's MLX implementation (`ModelRunner`): the forward passes, KV arrays,
sampling, logits processors and grammar masks. With engine/distributed/, the only engine code
that imports MLX; nothing outside the engine imports it directly (`build_engine` does)."""
