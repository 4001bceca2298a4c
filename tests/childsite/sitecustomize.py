"""Imported by every Python process the tests start (``child_env`` puts this folder
first on PYTHONPATH; vLLM's engine cores and workers inherit it).

Why: a process that has imported vLLM, torch and transformers holds millions of objects,
and the interpreter's last garbage collections at exit walk all of them: 30 to 60
CPU-seconds per process on a 2-core CI runner, in every engine runner, engine core and
child interpreter, after its test has its answer. Freezing the heap once the exit
handlers have run (``atexit`` runs handlers last-registered first, so this one runs
after vLLM's shutdown hooks) leaves those collections nothing to walk. What a test
observes before exit is unchanged.
"""

import atexit
import gc

atexit.register(gc.freeze)
