"""The runtime-patch mechanism: attribute patches and their groups, the registry of every
runtime patch with the phase that applies it, and the torch-level fixes. The
install-time file patcher is ``vllm_kunlun.file_patches``."""
