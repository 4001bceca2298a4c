"""Attention: the backends vLLM selects (portable paged attention in ``backend.py``,
the Kunlun backend in ``kunlun.py``, both chosen by ``select.py``, their shared metadata
in ``common.py``, the page and kernel-block arithmetic in ``block_sizes.py``) and the
kernels under them: the vendor call forms (``paged_vendor.py``) and the portable torch
kernel (``paged_portable.py``)."""
