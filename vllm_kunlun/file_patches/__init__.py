"""The install-time file patcher: the patch set, its engine and file operations, and the
``vllm-kunlun patch`` command. Runtime patches (attributes changed in a live process)
are ``vllm_kunlun.patching``'s job, not this package's."""
