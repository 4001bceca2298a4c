"""Loggers for the plugin, inside vLLM's logger tree.

vLLM configures handlers, level and format (VLLM_LOGGING_LEVEL, VLLM_LOGGING_CONFIG_PATH)
for the ``vllm`` logger only; a logger named ``vllm_kunlun.ops`` would print nothing below
WARNING. Naming ours ``vllm.vllm_kunlun.ops`` makes them follow the user's vLLM logging
settings, with vLLM's ``*_once`` helpers.
"""

from __future__ import annotations

from vllm.logger import _VllmLogger
from vllm.logger import init_logger as _vllm_init_logger


def init_logger(name: str) -> _VllmLogger:
    return _vllm_init_logger(f"vllm.{name}")
