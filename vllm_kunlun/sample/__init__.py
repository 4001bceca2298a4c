"""Device-side sampling for vLLM's sampler, rejection sampler and spec decode.

On Kunlun, ``Tensor.exponential_`` has no device kernel and silently runs on the CPU;
nothing in this package calls it. ``sampler_patches`` installs the replacements into
vLLM.
"""
