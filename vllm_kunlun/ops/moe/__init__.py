"""Mixture-of-experts kernels (Qwen3.5-MoE's routed experts): the seam and its torch
custom op (``seam.py``) and the portable torch computation (``portable.py``)."""
