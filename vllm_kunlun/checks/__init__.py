"""The checks the engine (guards/) and the doctor share, each returning a ``Finding``:
KV budget, weights, model path, config files, the installed stack."""
