"""Gated DeltaNet (GDN) kernels in portable torch: gating, causal conv1d, delta rule.

Why: vLLM 0.15.1 runs Qwen3-Next / Qwen3.5 linear attention only through Triton kernels
(``layers/fla/ops``, ``mamba/ops/causal_conv1d``, ``fused_gdn_gating``). Without an
active Triton driver (host emulation, CI, a Kunlun host whose vendor kernels are
missing) the first prefill fails. These are the same operations in plain torch, on any
device, reading and writing vLLM's state views in place:
  conv state  ``[slots, dim, K - 1 (+ num_spec)]`` (vLLM's ``kv_cache[0]`` transposed),
  SSM state   ``[slots, HV, dk, dv]`` (``kv_cache[1]``).

The math (transformers' Qwen3.5 reference semantics, fp32 accumulation):
  g_t = -exp(A_log) * softplus(a_t + dt_bias),  beta_t = sigmoid(b_t)
  q, k l2-normalised (eps 1e-6), q scaled by dk^-0.5; value head j reads key head
  j // (HV / H);
  S_t = exp(g_t) S_{t-1} + k_t u_t^T,  u_t = beta_t (v_t - (exp(g_t) S_{t-1})^T k_t),
  o_t = S_t^T q_t.
The decode path steps that recurrence; the prefill path evaluates it chunk by chunk in
the WY form: inside a chunk with cumulative log-decay c_i and start state S,
  (I + A) U = diag(beta) V - diag(beta e^c) K S,  A_ij = beta_i e^(c_i - c_j) k_i.k_j (j<i)
  O = diag(e^c) Q S + ((Q K^T) * e^(c_i - c_j), j <= i) U
  S' = e^(c_last) S + (K * e^(c_last - c))^T U
so the state is touched once per chunk and the triangular solve replaces the loop.

Removal: never; this is the reference every faster path is tested against. Speed on a
device comes from the vendor or Triton kernels (``ops/gdn/seam.py`` chooses).
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

PAD_SLOT_ID = -1
L2NORM_EPS = 1e-6
CHUNK_SIZE = 64


# ---- gating -----------------------------------------------------------------------------


def gdn_gating(
    A_log: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    dt_bias: torch.Tensor,
    beta: float = 1.0,
    threshold: float = 20.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(g, beta) of shape ``[1, T, HV]``: g in float32, beta in ``b``'s dtype."""
    x = a.float() + dt_bias.float()
    g = -A_log.float().exp() * F.softplus(x, beta=beta, threshold=threshold)
    return g.unsqueeze(0), b.float().sigmoid().to(b.dtype).unsqueeze(0)


# ---- causal conv1d ----------------------------------------------------------------------


def _activate(x: torch.Tensor, activation: str | bool | None) -> torch.Tensor:
    if activation in ("silu", "swish", True):
        return F.silu(x)
    if activation in (None, False):
        return x
    raise ValueError(f"causal conv1d activation {activation!r}: use 'silu' or None")


def causal_conv1d_varlen(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_states: torch.Tensor,
    query_start_loc: torch.Tensor,
    cache_indices: torch.Tensor,
    has_initial_state: torch.Tensor | None,
    activation: str | bool | None = "silu",
) -> torch.Tensor:
    """Depthwise causal conv over concatenated sequences, carrying each one's state.

    ``x`` is ``[dim, tokens]``; sequence ``i`` is ``x[:, qsl[i]:qsl[i+1]]`` and its
    history is ``conv_states[cache_indices[i]]`` (``[dim, K - 1]``) when
    ``has_initial_state[i]``, else zeros. Afterwards that slot holds the last ``K - 1``
    inputs (history included when the sequence is shorter). Returns ``[dim, tokens]``.
    """
    width = weight.shape[-1]
    out = torch.empty_like(x)
    starts = query_start_loc.tolist()
    slots = cache_indices.tolist()
    initial = (
        has_initial_state.tolist()
        if has_initial_state is not None
        else [False] * len(slots)
    )
    w = weight.unsqueeze(1).to(torch.float32)  # [dim, 1, K]
    b = bias.to(torch.float32) if bias is not None else None
    for i, slot in enumerate(slots):
        start, end = starts[i], starts[i + 1]
        if slot == PAD_SLOT_ID or end == start:
            continue
        if initial[i]:
            # The first K - 1 columns: under speculative decoding the slot is wider.
            history = conv_states[slot, :, : width - 1].to(torch.float32)
        else:
            history = x.new_zeros(x.shape[0], width - 1, dtype=torch.float32)
        window = torch.cat([history, x[:, start:end].to(torch.float32)], dim=-1)
        y = F.conv1d(window.unsqueeze(0), w, b, groups=x.shape[0])[0]
        out[:, start:end] = _activate(y, activation).to(x.dtype)
        conv_states[slot, :, : width - 1] = window[:, -(width - 1) :].to(
            conv_states.dtype
        )
    return out


def _conv_multi_uniform(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | bool | None,
    slots: list[int],
    starts: list[int],
    accepted: list[int] | None,
    out: torch.Tensor,
) -> bool:
    """``causal_conv1d_multi`` for the common batch (every sequence ``L`` tokens, no
    padding slot) in one pass; False (nothing done) otherwise. A ragged batch runs
    it once per sequence."""
    n = len(starts) - 1
    slots = slots[:n]
    if n == 0 or PAD_SLOT_ID in slots:
        return False
    length = starts[1] - starts[0]
    if length == 0 or any(starts[i + 1] - starts[i] != length for i in range(n)):
        return False
    width = w.shape[-1]
    dim = x.shape[-1]
    slot_t = torch.tensor(slots, device=conv_state.device)
    offsets = torch.tensor(
        [a - 1 for a in accepted] if accepted is not None else [0] * n,
        device=conv_state.device,
    )
    pool = conv_state.index_select(0, slot_t).to(torch.float32)  # [n, dim, S]
    cols = offsets[:, None] + torch.arange(width - 1, device=pool.device)  # [n, K-1]
    history = pool.gather(2, cols[:, None, :].expand(n, dim, width - 1))
    new = x[starts[0] : starts[0] + n * length].to(torch.float32)
    new = new.view(n, length, dim).transpose(1, 2)  # [n, dim, L]
    window = torch.cat([history, new], dim=-1)  # [n, dim, K - 1 + L]
    y = sum(w[None, :, j, None] * window[:, :, j : j + length] for j in range(width))
    if bias is not None:
        y = y + bias.to(torch.float32)[None, :, None]
    y = _activate(y, activation)  # [n, dim, L]
    out[starts[0] : starts[0] + n * length] = (
        y.transpose(1, 2).reshape(n * length, dim).to(x.dtype)
    )
    if accepted is not None:
        kept = pool.gather(
            2, (cols[:, 1:])[:, None, :].expand(n, dim, width - 2)
        )  # columns a .. a + K - 3
        state = torch.cat([kept, new], dim=-1)
    else:
        state = window[:, :, -(width - 1) :]
    conv_state[slot_t, :, : state.shape[-1]] = state.to(conv_state.dtype)
    return True


def causal_conv1d_multi(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | bool | None,
    conv_state_indices: torch.Tensor,
    query_start_loc: torch.Tensor,
    num_accepted_tokens: torch.Tensor | None,
) -> torch.Tensor:
    """Several new tokens per sequence on top of a carried state (speculative decode).

    ``x`` is ``[tokens, dim]``, sequence ``n`` is ``x[qsl[n]:qsl[n+1]]`` (``L`` tokens)
    and its state slot is ``conv_state_indices[n]`` (column 0 of a 2-D index tensor).
    vLLM's layout under speculative decoding (its Triton ``causal_conv1d_update``):
    the slot ``[dim, K - 1 + num_spec]`` holds a window in which the ``K - 1`` inputs
    before this step's first token start at column ``a - 1``, ``a`` the sequence's
    ``num_accepted_tokens`` (the tokens of the last step the sampler kept). Afterwards
    the slot holds ``K - 2`` inputs of history followed by this step's ``L`` inputs,
    so the next step, with ``a'`` accepted, finds the inputs ending at its last kept
    token at column ``a' - 1``. Without ``num_accepted_tokens`` the history is
    columns ``0 .. K - 2`` and the slot keeps the last ``K - 1`` inputs.
    Returns ``[tokens, dim]``.
    """
    out = torch.zeros_like(x)
    starts = query_start_loc.tolist()
    idx = conv_state_indices
    slots = (idx[:, 0] if idx.dim() == 2 else idx).tolist()
    accepted = num_accepted_tokens.tolist() if num_accepted_tokens is not None else None
    w = weight.to(torch.float32)  # [dim, K]
    fast = _conv_multi_uniform(
        x, conv_state, w, bias, activation, slots, starts, accepted, out
    )
    if fast:
        return out
    # Ragged lengths or padding: each sequence is a batch of one.
    for n, slot in enumerate(slots[: len(starts) - 1]):
        start, end = starts[n], starts[n + 1]
        if slot == PAD_SLOT_ID or end == start:
            continue
        one_accepted = [accepted[n]] if accepted is not None else None
        _conv_multi_uniform(
            x[start:end],
            conv_state,
            w,
            bias,
            activation,
            [slot],
            [0, end - start],
            one_accepted,
            out[start:end],
        )
    return out


def causal_conv1d_step(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | bool | None,
    conv_state_indices: torch.Tensor,
) -> torch.Tensor:
    """One new token per sequence: ``x`` ``[batch, dim]``; updates the states in place.

    Rows whose index is the pad slot (-1, CUDA-graph padding) produce zeros and touch
    no state.
    """
    out = torch.zeros_like(x)
    idx = conv_state_indices.to(torch.long)
    rows = torch.nonzero(idx != PAD_SLOT_ID).squeeze(1)
    if rows.numel() == 0:
        return out
    slots = idx.index_select(0, rows)
    width = weight.shape[-1]
    history = conv_state.index_select(0, slots)[:, :, : width - 1].to(torch.float32)
    window = torch.cat(
        [history, x.index_select(0, rows).to(torch.float32).unsqueeze(-1)], dim=-1
    )
    y = (window * weight.to(torch.float32).unsqueeze(0)).sum(-1)
    if bias is not None:
        y = y + bias.to(torch.float32)
    out.index_copy_(0, rows, _activate(y, activation).to(x.dtype))
    if conv_state.shape[-1] == width - 1:
        conv_state.index_copy_(0, slots, window[:, :, 1:].to(conv_state.dtype))
    else:  # a slot widened for speculative decoding: its first K - 1 columns
        conv_state[slots, :, : width - 1] = window[:, :, 1:].to(conv_state.dtype)
    return out


# ---- delta rule -------------------------------------------------------------------------


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def _prepare_qk(
    q: torch.Tensor, k: torch.Tensor, num_v_heads: int, scale: float, l2norm: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 q, k with one head per value head (``[T, HV, dk]``), q scaled."""
    q, k = q.to(torch.float32), k.to(torch.float32)
    if l2norm:
        q, k = _l2norm(q), _l2norm(k)
    repeat = num_v_heads // q.shape[-2]
    if repeat > 1:
        q = q.repeat_interleave(repeat, dim=-2)
        k = k.repeat_interleave(repeat, dim=-2)
    return q * scale, k


def _seq_bounds(cu_seqlens: torch.Tensor | None, total: int) -> list[tuple[int, int]]:
    if cu_seqlens is None:
        return [(0, total)]
    starts = cu_seqlens.tolist()
    return list(itertools.pairwise(starts))


def recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    state: torch.Tensor,
    cu_seqlens: torch.Tensor | None,
    state_indices: torch.Tensor | None,
    use_qk_l2norm: bool = True,
    num_accepted_tokens: torch.Tensor | None = None,
) -> torch.Tensor:
    """Token-by-token recurrence for varlen ``[1, T, H, d]`` inputs (decode).

    Sequence ``n`` starts from ``state[state_indices[n]]`` (or ``state[n]`` without
    indices) and its final state is written back there. With 2-D ``state_indices``
    (speculative decoding, vLLM's layout: one slot per query token of a sequence) it
    starts from slot ``[n, a - 1]``, ``a`` its ``num_accepted_tokens`` (1 without),
    and the state after its token ``t`` is written to slot ``[n, t]``: the next step
    then starts from the state of the last token its sampler kept. Returns
    ``[1, T, HV, dv]`` in ``v``'s dtype.
    """
    num_v_heads = v.shape[-2]
    qf, kf = _prepare_qk(q[0], k[0], num_v_heads, scale, use_qk_l2norm)
    vf, gf, bf = (
        v[0].to(torch.float32),
        g[0].to(torch.float32),
        beta[0].to(torch.float32),
    )
    out = torch.zeros(v.shape[1:], dtype=torch.float32, device=v.device)
    bounds = _seq_bounds(cu_seqlens, v.shape[1])
    if state_indices is not None and state_indices.dim() == 2:
        return _recurrent_per_token_states(
            qf, kf, vf, gf, bf, out, state, bounds, state_indices, num_accepted_tokens
        ).to(v.dtype)
    slots = (
        state_indices.reshape(len(bounds), -1)[:, 0].tolist()
        if state_indices is not None
        else list(range(len(bounds)))
    )
    live = [n for n, (s, e) in enumerate(bounds) if e > s and slots[n] != PAD_SLOT_ID]
    if not live:
        return out.to(v.dtype).unsqueeze(0)
    slot_t = torch.tensor([slots[n] for n in live], device=state.device)
    h = state.index_select(0, slot_t).to(torch.float32)  # [n, HV, dk, dv]
    starts = torch.tensor([bounds[n][0] for n in live], device=v.device)
    lengths = [bounds[n][1] - bounds[n][0] for n in live]
    for t in range(max(lengths)):
        active = torch.tensor([t < length for length in lengths], device=v.device)
        pos = starts + t
        pos = torch.where(active, pos, starts)  # any valid row; masked below
        q_t, k_t, v_t = qf[pos], kf[pos], vf[pos]  # [n, HV, d]
        decay = gf[pos].exp()[..., None, None]  # [n, HV, 1, 1]
        h_dec = h * decay
        u = (v_t - torch.einsum("nhkv,nhk->nhv", h_dec, k_t)) * bf[pos][..., None]
        h_new = h_dec + k_t.unsqueeze(-1) * u.unsqueeze(-2)
        mask = active[:, None, None, None]
        h = torch.where(mask, h_new, h)
        o_t = torch.einsum("nhkv,nhk->nhv", h_new, q_t)
        rows = torch.nonzero(active).squeeze(1)
        out.index_copy_(0, pos.index_select(0, rows), o_t.index_select(0, rows))
    state.index_copy_(0, slot_t, h.to(state.dtype))
    return out.to(v.dtype).unsqueeze(0)


def _recurrent_per_token_states(
    qf: torch.Tensor,
    kf: torch.Tensor,
    vf: torch.Tensor,
    gf: torch.Tensor,
    bf: torch.Tensor,
    out: torch.Tensor,
    state: torch.Tensor,
    bounds: list[tuple[int, int]],
    state_indices: torch.Tensor,
    num_accepted_tokens: torch.Tensor | None,
) -> torch.Tensor:
    """All sequences together, token ``t`` of each per iteration (a speculative step
    has at most ``num_spec + 1`` tokens): the recurrence of ``recurrent_gated_delta_
    rule``, each token's state written to its own slot."""
    slots = state_indices.tolist()
    accepted = (
        num_accepted_tokens.tolist()
        if num_accepted_tokens is not None
        else [1] * len(bounds)
    )
    live = [
        n for n, (s, e) in enumerate(bounds) if e > s and slots[n][0] != PAD_SLOT_ID
    ]
    if not live:
        return out.unsqueeze(0)
    first = torch.tensor([slots[n][accepted[n] - 1] for n in live], device=state.device)
    h = state.index_select(0, first).to(torch.float32)  # [n, HV, dk, dv]
    lengths = [bounds[n][1] - bounds[n][0] for n in live]
    uniform = all(length == lengths[0] for length in lengths)
    dst = [slots[n][t] for n in live for t in range(lengths[0])] if uniform else []
    if uniform and PAD_SLOT_ID not in dst and len(set(dst)) == len(dst):
        _uniform_per_token_states(
            qf, kf, vf, gf, bf, out, state, h, [bounds[n][0] for n in live], dst
        )
        return out.unsqueeze(0)
    starts = torch.tensor([bounds[n][0] for n in live], device=vf.device)
    for t in range(max(lengths)):
        rows = [i for i, length in enumerate(lengths) if t < length]
        sel = torch.tensor(rows, device=vf.device)
        pos = starts.index_select(0, sel) + t
        h_t = h.index_select(0, sel) * gf[pos].exp()[..., None, None]
        u = (vf[pos] - torch.einsum("nhkv,nhk->nhv", h_t, kf[pos])) * bf[pos][..., None]
        h_t = h_t + kf[pos].unsqueeze(-1) * u.unsqueeze(-2)
        out.index_copy_(0, pos, torch.einsum("nhkv,nhk->nhv", h_t, qf[pos]))
        h.index_copy_(0, sel, h_t)
        writes = [(j, slots[live[i]][t]) for j, i in enumerate(rows)]
        writes = [(j, slot) for j, slot in writes if slot != PAD_SLOT_ID]
        if writes:
            src = torch.tensor([j for j, _ in writes], device=vf.device)
            dst = torch.tensor([slot for _, slot in writes], device=state.device)
            state.index_copy_(0, dst, h_t.index_select(0, src).to(state.dtype))
    return out.unsqueeze(0)


def _uniform_per_token_states(
    qf: torch.Tensor,
    kf: torch.Tensor,
    vf: torch.Tensor,
    gf: torch.Tensor,
    bf: torch.Tensor,
    out: torch.Tensor,
    state: torch.Tensor,
    h: torch.Tensor,
    starts: list[int],
    dst: list[int],
) -> None:
    """``_recurrent_per_token_states`` when every live sequence has the same length
    ``L`` (a speculative decode step: ``num_spec + 1`` tokens each) and its ``n * L``
    state slots are distinct and real: the inputs gathered once as ``[n, L, ...]``,
    the outputs and the per-token states written in one scatter each (the same
    arithmetic, in the same order, as the general loop)."""
    n, length = len(starts), len(dst) // len(starts)
    pos = (
        torch.tensor(starts, device=vf.device)[:, None]
        + torch.arange(length, device=vf.device)[None, :]
    ).reshape(-1)
    q, k, v, g, b = (
        x.index_select(0, pos).unflatten(0, (n, length)) for x in (qf, kf, vf, gf, bf)
    )
    decay = g.exp()[..., None, None]  # [n, L, HV, 1, 1]
    # Row vectors for the batched products: k_t^T S as [n, HV, 1, dk] @ [n, HV, dk, dv]
    # (what the general loop's einsum computes, without parsing its equation per call).
    q_row, k_row = q.unsqueeze(-2), k.unsqueeze(-2)
    k_col, b_col = k.unsqueeze(-1), b.unsqueeze(-1)
    outs, states = [], []
    for t in range(length):
        h = h * decay[:, t]
        u = (v[:, t] - (k_row[:, t] @ h).squeeze(-2)) * b_col[:, t]
        h = h + k_col[:, t] * u.unsqueeze(-2)
        outs.append((q_row[:, t] @ h).squeeze(-2))
        states.append(h)
    out.index_copy_(0, pos, torch.stack(outs, dim=1).flatten(0, 1))
    written = torch.stack(states, dim=1).flatten(0, 1).to(state.dtype)
    state.index_copy_(0, torch.tensor(dst, device=state.device), written)


def _chunked_sequence(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    h: torch.Tensor,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence in the WY form. Inputs float32: q, k ``[L, HV, dk]`` (prepared),
    v ``[L, HV, dv]``, g and beta ``[L, HV]``, h ``[HV, dk, dv]``."""
    length = q.shape[0]
    # The WY form is exact for any chunk length: short sequences (decodes sharing a
    # step with prefills) use one chunk of their own length instead of padding to 64.
    chunk_size = min(chunk_size, length)
    pad = (-length) % chunk_size
    if pad:
        q, k, v = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (q, k, v))
        g, beta = (F.pad(t, (0, 0, 0, pad)) for t in (g, beta))
    n = q.shape[0] // chunk_size

    def chunks(t: torch.Tensor) -> torch.Tensor:  # [L, HV, ...] -> [n, HV, C, ...]
        return t.reshape(n, chunk_size, *t.shape[1:]).transpose(1, 2)

    qc, kc, vc, gc, bc = (chunks(t) for t in (q, k, v, g, beta))
    c = gc.cumsum(-1)  # [n, HV, C] cumulative log-decay inside each chunk
    diff = c.unsqueeze(-1) - c.unsqueeze(-2)  # c_i - c_j
    idx = torch.arange(chunk_size, device=q.device)
    lower = idx[:, None] >= idx[None, :]
    strict = idx[:, None] > idx[None, :]
    decay = torch.where(lower, diff, torch.full_like(diff, float("-inf"))).exp()

    kk = kc @ kc.transpose(-1, -2)
    a = torch.where(strict, kk * decay, torch.zeros_like(kk)) * bc.unsqueeze(-1)
    eye = torch.eye(chunk_size, device=q.device, dtype=a.dtype)
    # U = T (diag(beta) V - diag(beta e^c) K S), T = (I + A)^-1 (unit lower triangular)
    rhs_v = vc * bc.unsqueeze(-1)
    rhs_k = kc * (bc * c.exp()).unsqueeze(-1)
    u_base = torch.linalg.solve_triangular(
        eye + a, rhs_v, upper=False, unitriangular=True
    )
    w = torch.linalg.solve_triangular(eye + a, rhs_k, upper=False, unitriangular=True)
    qk = torch.where(lower, (qc @ kc.transpose(-1, -2)) * decay, torch.zeros_like(kk))
    q_decayed = qc * c.exp().unsqueeze(-1)
    last = c[..., -1:]  # [n, HV, 1]
    k_tail = kc * (last - c).exp().unsqueeze(-1)

    outs = []
    for i in range(n):
        u = u_base[i] - w[i] @ h  # [HV, C, dv]
        outs.append(q_decayed[i] @ h + qk[i] @ u)
        h = h * last[i].exp().unsqueeze(-1) + k_tail[i].transpose(-1, -2) @ u
    o = torch.stack(outs).transpose(1, 2).reshape(n * chunk_size, *v.shape[1:])
    return o[:length], h


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float,
    initial_state: torch.Tensor | None,
    cu_seqlens: torch.Tensor | None,
    use_qk_l2norm: bool = True,
    chunk_size: int = CHUNK_SIZE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked (WY) delta rule for varlen ``[1, T, H, d]`` inputs (prefill).

    ``initial_state`` is ``[N, HV, dk, dv]`` (one per sequence; None: zeros). Returns
    the output ``[1, T, HV, dv]`` in ``v``'s dtype and the final states
    ``[N, HV, dk, dv]`` in float32.
    """
    num_v_heads, dk, dv = v.shape[-2], q.shape[-1], v.shape[-1]
    qf, kf = _prepare_qk(q[0], k[0], num_v_heads, scale, use_qk_l2norm)
    vf, gf, bf = (
        v[0].to(torch.float32),
        g[0].to(torch.float32),
        beta[0].to(torch.float32),
    )
    bounds = _seq_bounds(cu_seqlens, v.shape[1])
    out = torch.zeros(v.shape[1:], dtype=torch.float32, device=v.device)
    finals = torch.zeros(len(bounds), num_v_heads, dk, dv, device=v.device)
    for n, (s, e) in enumerate(bounds):
        h = (
            initial_state[n].to(torch.float32)
            if initial_state is not None
            else finals[n].clone()
        )
        if e == s:
            finals[n] = h
            continue
        o, h = _chunked_sequence(
            qf[s:e], kf[s:e], vf[s:e], gf[s:e], bf[s:e], h, chunk_size
        )
        out[s:e] = o
        finals[n] = h
    return out.to(v.dtype).unsqueeze(0), finals
