"""Multi-head latent attention (DeepSeek-V2/V3 family): the latent KV cache, prefill
and absorbed decode, in plain torch (``portable.py``) or on the vendor kernels, chosen
by the one chooser (``seam.py``), served to vLLM as an MLA backend (``backend.py``)."""
