"""``vllm-kunlun accuracy``: does a live vLLM deployment compute the checkpoint's
numbers? Teacher-forced prompt logprobs from the server (``endpoint``) against
transformers on the CPU (``reference``), compared and judged (``compare``)."""
