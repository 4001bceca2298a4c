"""The Kunlun and host-emulation platforms vLLM loads, their engine defaults, workers,
communicator and graph policy. Which one a process gets is ``vllm_kunlun.hardware``'s
choice (``select_platform``), made without importing this package."""
