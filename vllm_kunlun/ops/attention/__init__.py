"""Paged-attention kernels for the backends of ``vllm_kunlun/attention/``: the vendor
call forms (``paged_vendor.py``) and the portable torch kernel (``paged_portable.py``)."""
