"""Quantized checkpoints on vllm-kunlun platforms: the int8 kernel vLLM selects for
W8A8 layers, and the runtime patch that registers it."""
