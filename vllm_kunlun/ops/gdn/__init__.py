"""Gated DeltaNet kernels: the seam that routes vLLM's five GDN entry points
(``seam.py``) and the portable torch kernels behind it (``portable.py``)."""
