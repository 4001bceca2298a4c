"""Multi-head latent attention written out for the MLA unit tests
(test_mla_portable.py, test_mla_backend.py): DeepSeek's MLA in its un-absorbed form,
per-head keys ``[kv_c W_UK, k_pe]`` and values ``kv_c W_UV`` for every token, causal
softmax in float64, one query and one head at a time."""

from __future__ import annotations

import torch


def reference(q, kv_c, k_pe, w_uk, w_uv, scale):
    """Causal MHA of the last ``len(q)`` positions over all ``len(kv_c)`` tokens, one
    query and one head at a time, float64. q: [n, H, P + R]."""
    n, heads, _ = q.shape
    total = kv_c.shape[0]
    p = w_uk.shape[2]
    out = torch.zeros(n, heads, w_uv.shape[2], dtype=torch.float64)
    for i in range(n):
        pos = total - n + i
        for h in range(heads):
            scores = []
            for t in range(pos + 1):
                k_nope = kv_c[t].double() @ w_uk[:, h].double()
                k = torch.cat([k_nope, k_pe[t].double()])
                scores.append(float(q[i, h].double() @ k) * scale)
            w = torch.softmax(torch.tensor(scores, dtype=torch.float64), dim=0)
            for t in range(pos + 1):
                out[i, h] += w[t] * (kv_c[t].double() @ w_uv[:, h].double())
    assert q.shape[2] == p + k_pe.shape[1]
    return out
