"""Sampling kernels: the vendor seam (``seam.py``), the portable torch sampler
(``portable.py``, over ``kept_set``, ``draw`` and ``threshold``), the plugin's C++ CPU
kernel (``native_cpu.py``), random numbers (``rng.py``, ``noise.py``), speculative
decoding's recovered tokens, and flashinfer's sampling API for kernel developers
(``flashinfer_api.py``)."""
