"""`python -m vllm_kunlun.cli`: the same as the `vllm-kunlun` command."""

import sys

from vllm_kunlun.cli import main

sys.exit(main())
