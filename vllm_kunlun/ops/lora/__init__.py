"""LoRA kernels (shrink / expand) and the punica wrapper vLLM's LoRA layers call."""
