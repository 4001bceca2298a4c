"""W8A8 int8 linear kernels: the seam and its torch custom op (``seam.py``) and the
portable torch computation (``portable.py``)."""
