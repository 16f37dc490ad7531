"""Helpers of the Python tests: random inputs, the pure-PyTorch fp64
references, the error metric, output poisoning and the GPU skip marker."""

import contextlib
import zlib

import pytest
import torch
import torch.nn.functional as F

HAS_GPU = torch.cuda.is_available()
requires_gpu = pytest.mark.skipif(not HAS_GPU, reason="no GPU")

# Relative RMS error allowed against the fp64 reference of the same (rounded)
# inputs: accumulation in fp32 plus the rounding of the output to its dtype.
TOLERANCE = {torch.float64: 1e-10, torch.float32: 3e-5, torch.bfloat16: 1.6e-2, torch.float16: 3e-3}
GRAD_TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 6e-3}


def rel_rms_error(out, ref):
    """‖out − ref‖ / ‖ref‖ in fp64 (‖out‖ when ref is all zero); NaN when out holds NaN or Inf."""
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    assert out.shape == ref.shape, f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    if not torch.isfinite(out).all():
        return float("nan")
    norm = ref.norm()
    return ((out - ref).norm() / (norm if norm > 0 else max(out.norm(), 1e-300))).item()


def assert_close(out, ref, tolerance, name):
    error = rel_rms_error(out, ref)
    assert error <= tolerance, f"{name}: relative RMS error {error:.3g} > {tolerance:.3g}"  # NaN fails too


@contextlib.contextmanager
def poisoned_outputs():
    """torch.empty fills float memory with NaN while this is active, so an output
    element the op never writes cannot pass by holding a stale correct value."""
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was)


def generator(request):
    """A generator seeded from the test's id: fresh random data per test, reproducible per id."""
    return torch.Generator().manual_seed(zlib.crc32(request.node.nodeid.encode()))


def randn(gen, *shape, dtype=torch.float64):
    return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)


def gla_inputs(gen, B, T, H, K, V, gate="vector", num_states=None, dtype=torch.float64, gate_scale=1.0):
    """q, k, v, g (log-space, ≤ 0) and h0, as fp64 CPU tensors rounded to `dtype`'s precision.
    gate: "vector" [B,T,H,K], "scalar" [B,T,H] or None. h0 [N,H,K,V] fp32 (N = num_states or B)."""
    q = randn(gen, B, T, H, K, dtype=dtype)
    k = randn(gen, B, T, H, K, dtype=dtype)
    v = randn(gen, B, T, H, V, dtype=dtype)
    g = None
    if gate == "vector":
        g = (F.logsigmoid(randn(gen, B, T, H, K)) * gate_scale).to(dtype)
    elif gate == "scalar":
        g = (F.logsigmoid(randn(gen, B, T, H)) * gate_scale).to(dtype)
    h0 = randn(gen, num_states or B, H, K, V, dtype=torch.float32)
    return q, k, v, g, h0


def sequences(B, T, cu_seqlens):
    """(batch row, begin, end) of every sequence."""
    if cu_seqlens is None:
        return [(b, 0, T) for b in range(B)]
    bounds = cu_seqlens.tolist()
    return [(0, bounds[n], bounds[n + 1]) for n in range(len(bounds) - 1)]


def naive_gla(q, k, v, g=None, scale=None, initial_state=None, cu_seqlens=None, reverse=False):
    """Token-by-token GLA in fp64 (differentiable): S_t = diag(exp g_t) S_{t-1} + k_t^T v_t,
    o_t = scale q_t S_t. Returns o [B,T,H,V] and the final states [N,H,K,V], both fp64."""
    q, k, v = q.double(), k.double(), v.double()
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    rows = [[None] * T for _ in range(B)]
    finals = []
    for n, (b, begin, end) in enumerate(sequences(B, T, cu_seqlens)):
        state = torch.zeros(H, K, V, dtype=torch.float64) if initial_state is None else initial_state[n].double()
        steps = range(end - 1, begin - 1, -1) if reverse else range(begin, end)
        for t in steps:
            if g is not None:
                decay = g[b, t].double().exp()
                state = (decay[..., None] if g.dim() == 4 else decay[:, None, None]) * state
            state = state + k[b, t][:, :, None] * v[b, t][:, None, :]
            rows[b][t] = scale * torch.einsum("hk,hkv->hv", q[b, t], state)
        finals.append(state)
    o = torch.stack([torch.stack(r) if T else torch.zeros(0, H, V, dtype=torch.float64) for r in rows])
    return o, torch.stack(finals)


def naive_attention(q, k, v, causal=True, scale=None, cu_seqlens=None, cu_seqlens_k=None):
    """Softmax attention in fp64 with bottom-right causal alignment and grouped KV heads; the keys of
    packed sequences have their own boundaries cu_seqlens_k when given."""
    q, k, v = q.double(), k.double(), v.double()
    B, Tq, Hq, D = q.shape
    Hkv = k.shape[2]
    scale = D ** -0.5 if scale is None else scale
    k = k.repeat_interleave(Hq // Hkv, dim=2)
    v = v.repeat_interleave(Hq // Hkv, dim=2)
    if cu_seqlens is None:
        spans = [(b, 0, Tq, 0, k.shape[1]) for b in range(B)]
    else:
        bounds = cu_seqlens.tolist()
        key_bounds = bounds if cu_seqlens_k is None else cu_seqlens_k.tolist()
        spans = [(0, bounds[n], bounds[n + 1], key_bounds[n], key_bounds[n + 1]) for n in range(len(bounds) - 1)]
    pieces = {}
    for b, qb, qe, kb, ke in spans:
        scores = torch.einsum("qhd,khd->hqk", q[b, qb:qe], k[b, kb:ke]) * scale
        if causal:
            tq, tk = qe - qb, ke - kb
            mask = torch.arange(tk)[None, :] > torch.arange(tq)[:, None] + (tk - tq)
            scores = scores.masked_fill(mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a query that sees no key: o = 0
        pieces[(b, qb, kb)] = torch.einsum("hqk,khv->qhv", weights, v[b, kb:ke])
    rows = [torch.cat([pieces[key] for key in sorted(pieces) if key[0] == b], dim=0) for b in range(B)]
    return torch.stack(rows)


def cu(lengths, dtype=torch.int32):
    """cu_seqlens [N+1] of the given sequence lengths."""
    bounds = [0]
    for n in lengths:
        bounds.append(bounds[-1] + n)
    return torch.tensor(bounds, dtype=dtype)


def naive_normalize(o, q, k, scale=None, z_init=None, cu_seqlens=None, reverse=False):
    """The linear-attention normaliser in fp64 (differentiable), written from its definition: per sequence,
    z_t = z_init + the sum of k over the tokens up to t (from t to the end with reverse), and
    o_t / (scale * q_t . z_t + 1e-10). z_init and the returned z_state are [N, 1, H, K]."""
    o, q, k = o.double(), q.double(), k.double()
    B, T, H, K = q.shape
    scale = K ** -0.5 if scale is None else scale
    rows = [[None] * T for _ in range(B)]
    finals = []
    for n, (b, begin, end) in enumerate(sequences(B, T, cu_seqlens)):
        z = torch.zeros(H, K, dtype=torch.float64) if z_init is None else z_init[n, 0].double()
        steps = range(end - 1, begin - 1, -1) if reverse else range(begin, end)
        for t in steps:
            z = z + k[b, t]
            rows[b][t] = o[b, t] / (scale * (q[b, t] * z).sum(-1, keepdim=True) + 1e-10)
        finals.append(z[None])
    out = torch.stack([torch.stack(r) if T else o.new_zeros(0, H, o.shape[-1]) for r in rows])
    return out, torch.stack(finals)
