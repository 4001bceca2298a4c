"""Weight-only 4-bit / 8-bit linear kernels (compressed-tensors W4A16 / W8A16, AWQ,
GPTQ): the seam and its torch custom op (``seam.py``), the portable chunked torch
computation (``portable.py``), vLLM's mixed-precision kernel class
(``wna16_kernel.py``) and the patch that lists it (``wna16_kernel_table_patch.py``),
and vLLM's AWQ / GPTQ linear methods on the seam (``awq_method.py``,
``gptq_method.py``)."""
