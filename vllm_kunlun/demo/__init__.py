"""The demo layer: tiny offline checkpoints, the demo job, `vllm serve` as a child
process, and the worker extension that reports what served a request."""
