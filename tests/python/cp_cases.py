"""Context-parallel GLA ops against one process: run by test_distributed*.py.

    python cp_cases.py --world 2 --out DIR [--backend gloo|nccl] [--suite all|numerics|errors]

spawns `world` processes (one group, gloo on the CPU or NCCL on one GPU per
rank); each builds the same random global batch, runs the op on its slice
with cp_context and compares its output, final states and the gradients of
q, k, v, g with one process running the op on the whole batch (same dtype,
and fp64 reference), on every rank. Any failure makes the process exit with a
non-zero status; the caller's timeout turns a hang into a failure.
"""

import argparse
import os
import socket
import sys
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from spawn_utils import leave_group_and_exit


def rel_rms_error(out, ref):
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    assert out.shape == ref.shape, f"shape {tuple(out.shape)} != reference {tuple(ref.shape)}"
    if not torch.isfinite(out).all():
        return float("nan")
    norm = ref.norm()
    return ((out - ref).norm() / (norm if norm > 0 else max(out.norm(), 1e-300))).item()


OPS = {"vector": "chunk_gla", "scalar": "chunk_simple_gla", "none": "chunk_linear_attn"}


def run_op(gate, q, k, v, g, gamma=None, **kw):
    import flashgla
    if gate == "normalize":  # the final state and z_state as one [N, H·K·V + H·K] tensor (None without a state)
        o, (ht, z) = flashgla.chunk_linear_attn(q, k, v, normalize=True, **kw)
        return o, (torch.cat([ht.flatten(1), z.flatten(1).to(ht.dtype)], 1) if ht is not None else None)
    if gamma is not None:  # "gamma" (g is None) and "scalar+gamma"
        return flashgla.chunk_simple_gla(q, k, v, g, g_gamma=gamma, **kw)
    if gate == "vector":
        return flashgla.chunk_gla(q, k, v, g, **kw)
    if gate == "scalar":
        return flashgla.chunk_simple_gla(q, k, v, g, **kw)
    return flashgla.chunk_linear_attn(q, k, v, normalize=False, **kw)


def make_inputs(seed, B, T, H, K, V, gate, dtype, device, neg_inf_at=()):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen, dtype=torch.float64)
    k = torch.randn(B, T, H, K, generator=gen, dtype=torch.float64)
    v = torch.randn(B, T, H, V, generator=gen, dtype=torch.float64)
    g = None
    if gate == "vector":
        g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, K, generator=gen, dtype=torch.float64) + 2.0)
    elif gate in ("scalar", "scalar+gamma"):
        g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=gen, dtype=torch.float64) + 2.0)
    # A full reset of the state (some keys / one head) at token t: in fp64 exp(-1e4) is exactly 0, as
    # exp(-inf); in fp32 -60 (exp(-60) is far below fp32's resolution) keeps the one-process chunked
    # reference accurate (running gate sums of -1e4 cost it ~1e-3). -inf itself is handled by the summaries
    # and the fold (test_distributed.py::test_fold_of_summaries_neg_inf), but the local chunked kernels give
    # NaN for it, with or without CP.
    reset = -1e4 if dtype == torch.float64 else -60.0
    for t in neg_inf_at:
        if gate == "vector":
            g[:, t, :, ::2] = reset
        elif gate in ("scalar", "scalar+gamma"):
            g[:, t, 0] = reset
    do = torch.randn(B, T, H, V, generator=gen, dtype=torch.float64)
    if gate == "normalize":  # positive features, as linear attention's feature maps give (q·z well away from 0)
        q, k = q.abs() + 0.1, k.abs() + 0.1
    cast = [x.to(device=device, dtype=dtype) if x is not None else None for x in (q, k, v)]
    g = g.to(device=device, dtype=torch.float32 if dtype != torch.float64 else dtype) if g is not None else None
    return cast[0], cast[1], cast[2], g, do.to(device=device, dtype=dtype), gen


def make_gamma(seed, H, gate, device):
    """chunk_simple_gla's per-head log decay g_gamma [H] fp32 for the "gamma" gates, else None."""
    if "gamma" not in gate:
        return None
    gen = torch.Generator().manual_seed(seed)
    return (-0.02 - 0.3 * torch.rand(H, generator=gen, dtype=torch.float64)).to(device=device, dtype=torch.float32)


def local_pieces(bounds, world, local):
    """For every rank: its local sequences as global (seq_start, piece_end) pairs."""
    pieces = []
    for r in range(world):
        lo, hi = r * local, (r + 1) * local
        inner = sorted({b for b in bounds if lo < b < hi})
        ends = inner + [hi]
        starts = [lo] + inner
        out = []
        for s, e in zip(starts, ends):
            seq_start = max(b for b in bounds if b <= s)
            out.append((seq_start, e))
        pieces.append(out)
    return pieces


def reference(gate, q, k, v, g, do, bounds, world, local, dhts, scale, gamma=None):
    """One process: the op on the whole batch plus every rank's local final states; gradients of
    <o, do> + Σ <ht, dht> (of q, k, v, g and g_gamma)."""
    leaves = [x.detach().clone().requires_grad_() if x is not None else None for x in (q, k, v, g, gamma)]
    q, k, v, g, gamma = leaves
    B = q.shape[0]
    cu = torch.tensor(bounds, dtype=torch.int64, device=q.device) if B == 1 else None
    o, _ = run_op(gate, q, k, v, g, gamma, cu_seqlens=cu, scale=scale)
    loss = (o.double() * do.double()).sum()
    states = []
    for r, rank_pieces in enumerate(local_pieces(bounds, world, local)):
        rank_states = []
        for (s, e) in rank_pieces:
            sl = slice(s, e)
            _, ht = run_op(gate, q[:, sl], k[:, sl], v[:, sl], None if g is None else g[:, sl], gamma,
                           output_final_state=True, scale=scale)
            rank_states.append(ht)
        ht = torch.cat(rank_states, 0)
        states.append(ht)
        loss = loss + (ht.double() * dhts[r].double()).sum()
    loss.backward()
    return o.detach(), [s.detach() for s in states], [x.grad if x is not None else None for x in leaves]


def check_case(name, rank, world, dtype, device, gate, bounds, B=1, H=2, K=16, V=12, neg_inf_at=(),
               use_final_state=True, with_cpu_copy=False, seed=0, report=None, state_v_first=False):
    from flashgla.distributed import build_cp_context
    T = bounds[-1]
    local = T // world
    q, k, v, g, do, gen = make_inputs(1000 + seed, B, T, H, K, V, gate, dtype, device, neg_inf_at)
    gamma = make_gamma(2000 + seed, H, gate, device)
    scale = 0.3
    pieces = local_pieces(bounds, world, local)
    state_rows = [len(p) if B == 1 else B for p in pieces]
    state_dims = (H * K * V + H * K,) if gate == "normalize" else (H, K, V)
    dhts = [torch.randn(n, *state_dims, generator=gen, dtype=torch.float64).to(device=device, dtype=torch.float32)
            if use_final_state else torch.zeros(n, *state_dims, device=device) for n in state_rows]
    ref_o, ref_states, ref_grads = reference(gate, q, k, v, g, do, bounds, world, local, dhts, scale, gamma)

    cu = torch.tensor(bounds, dtype=torch.int32, device=device)
    ctx = build_cp_context(cu, None, cu_seqlens_cpu=cu.cpu() if with_cpu_copy else None)
    assert ctx.rank == rank and ctx.world_size == world and ctx.local_tokens == local
    # A slice that is one sequence runs the ordinary op as a fixed-length batch of one (its backward then splits
    # the state scans of one long sequence); a slice of several keeps its local boundaries.
    op_cu, _ = ctx.local_op_cu_seqlens(q)
    assert (op_cu is None) == (len(pieces[rank]) == 1), f"{name}: local op cu_seqlens {op_cu}"
    if op_cu is not None:
        assert torch.equal(op_cu.cpu(), ctx.cu_seqlens_cpu), f"{name}: local op cu_seqlens {op_cu}"
    sl = slice(ctx.token_offset, ctx.token_offset + local)
    mine = [x[:, sl].detach().clone().requires_grad_() if x is not None else None for x in (q, k, v, g)]
    layout = dict(state_v_first=True) if state_v_first else {}
    my_gamma = gamma.detach().clone().requires_grad_() if gamma is not None else None
    o, ht = run_op(gate, *mine, my_gamma, scale=scale, output_final_state=use_final_state, cp_context=ctx, **layout)
    if state_v_first and use_final_state:  # [N, H, V, K]: back to the reference's layout
        assert ht.shape == (state_rows[rank], H, V, K), f"state_v_first: final state of shape {tuple(ht.shape)}"
        ht = ht.transpose(-1, -2)
    loss = (o.double() * do[:, sl].double()).sum()
    if use_final_state:
        loss = loss + (ht.double() * dhts[rank].double()).sum()
    loss.backward()

    errors = {"o": rel_rms_error(o, ref_o[:, sl])}
    if use_final_state:
        errors["ht"] = rel_rms_error(ht, ref_states[rank])
    for label, x, ref in zip("qkvg", mine, ref_grads):
        if x is not None:
            errors["d" + label] = rel_rms_error(x.grad, ref[:, sl])
    if my_gamma is not None:  # each rank's share; the group's sum is the gradient
        total = my_gamma.grad.double().clone()
        dist.all_reduce(total)
        errors["d_g_gamma"] = rel_rms_error(total, ref_grads[4])
    if report is not None:
        report(name, errors)
    return errors


def numerics_cases(world):
    """(name, kwargs) of the layouts; local T is 70 (not a multiple of 64) unless said otherwise."""
    L = 70
    T = world * L
    cases = [
        ("one sequence over all ranks", dict(bounds=[0, T])),
        ("boundaries at rank edges", dict(bounds=[0] + [r * L for r in range(1, world)] + [T])),
        ("boundaries inside ranks", dict(bounds=[0, 9, L + 20, T - 5, T])),
        ("1-token sequences at the edges", dict(bounds=[0, L - 1, L, L + 1, T - 1, T])),
        ("local T = 128", dict(bounds=[0, 3, world * 128])),
        ("fixed length B = 3", dict(bounds=[0, T], B=3)),
        ("reset gate across a rank edge", dict(bounds=[0, 5, T], neg_inf_at=(L - 1, L + 2))),
        ("no final state", dict(bounds=[0, 30, T], use_final_state=False)),
        ("cu_seqlens_cpu given", dict(bounds=[0, L + 7, T], with_cpu_copy=True)),
        ("state_v_first", dict(bounds=[0, 9, L + 20, T - 5, T], state_v_first=True)),
        ("state_v_first, fixed length B = 2", dict(bounds=[0, T], B=2, state_v_first=True)),
    ]
    if world >= 4:
        cases.append(("a sequence crossing three ranks", dict(bounds=[0, 5, 2 * L + 9, T])))
        cases.append(("a sequence over the middle ranks", dict(bounds=[0, L, 3 * L, T])))
    return cases


# On GPUs: slices long enough that the local op splits them, so that its own split pass gives the summaries
# (flashgla/gla.h, GlaPhase): bf16_check asserts that the forward and the backward run in two calls.
LONG_CASES = [("one long sequence, the summaries from the op's split", dict(bounds=[0, 65536], long=True))]


def numerics(rank, world, device, dtypes):
    failures = []
    lines = []

    def report(name, errors):
        lines.append(f"  {name}: " + ", ".join(f"{k} {v:.2e}" for k, v in errors.items()))

    for dtype in dtypes:
        for gate in ("vector", "scalar", "none", "gamma", "scalar+gamma", "normalize"):
            for name, kw in numerics_cases(world) + (LONG_CASES if device.type == "cuda" else []):
                if gate in ("none", "gamma", "normalize") and kw.get("neg_inf_at"):
                    continue
                if gate in ("none", "normalize") and kw.get("state_v_first"):
                    continue
                if gate in ("gamma", "scalar+gamma", "normalize") and dtype not in (torch.float64, torch.float32):
                    continue  # the bf16 check covers the gate kinds of chunk_gla's CP path
                label = f"{dtype} {gate} gate: {name}"
                try:
                    if dtype in (torch.float64, torch.float32):
                        tol = 1e-10 if dtype == torch.float64 else 2e-5
                        errors = check_case(label, rank, world, dtype, device, gate, report=report, **kw)
                        # With g_gamma the op stages the gate g + g_gamma and its gradient in fp32 (C++ api,
                        # gla_gamma_gate / gla_gamma_grad) even for fp64 inputs: dg and d_g_gamma then carry fp32
                        # rounding in the one-process reference as under CP (measured ≤ 1.6e-7).
                        staged = ("dg", "d_g_gamma") if "gamma" in gate and dtype == torch.float64 else ()
                        bad = {k: e for k, e in errors.items() if not e <= (1e-6 if k in staged else tol)}
                        if bad:
                            failures.append(f"{label}: {bad} > {tol}")
                    else:  # bf16 on GPUs: CP vs fp64 within 2x of one GPU vs fp64
                        failures += bf16_check(label, rank, world, device, gate, kw, report)
                except Exception:  # noqa: BLE001 - every failure is reported with its case
                    failures.append(f"{label}: {traceback.format_exc()}")
    return failures, lines


def bf16_check(label, rank, world, device, gate, kw, report):
    """bf16 under CP: error against the fp64 one-process reference ≤ 2× that of one GPU in bf16."""
    from flashgla.distributed import build_cp_context
    bounds = kw["bounds"]
    B = kw.get("B", 1)
    H, K, V = 2, 64, 64
    T = bounds[-1]
    local = T // world
    q, k, v, g, do, _ = make_inputs(7, B, T, H, K, V, gate, torch.float64, torch.device("cpu"),
                                    kw.get("neg_inf_at", ()))
    scale = 0.125
    zero = [torch.zeros(len(p) if B == 1 else B, H, K, V, dtype=torch.float64) for p in local_pieces(bounds, world, local)]
    ref_o, _, ref_grads = reference(gate, q, k, v, g, do, bounds, world, local, zero, scale)
    to = [x.to(device=device, dtype=torch.bfloat16) if x is not None else None for x in (q, k, v)]
    gd = g.to(device=device, dtype=torch.float32) if g is not None else None
    dod = do.to(device=device, dtype=torch.bfloat16)
    # one GPU in bf16
    one = [x.detach().clone().requires_grad_() if x is not None else None for x in (*to, gd)]
    cu = torch.tensor(bounds, dtype=torch.int32, device=device)
    o1, _ = run_op(gate, *one, scale=scale, cu_seqlens=cu if B == 1 else None)
    o1.backward(dod)
    # agree_on_errors=False: the error agreement's read of the gathered flags would synchronise.
    ctx = build_cp_context(cu, None, cu_seqlens_cpu=cu.cpu(), agree_on_errors=False)
    sl = slice(ctx.token_offset, ctx.token_offset + local)
    mine = [x[:, sl].detach().clone().requires_grad_() if x is not None else None for x in (*to, gd)]
    d_local = dod[:, sl].contiguous()
    if kw.get("long"):
        from flashgla.ops.gla import _backward_in_phases, _forward_in_phases
        x = [t.detach() if t is not None else None for t in mine]
        if _forward_in_phases(*x, None, None, scale, False, torch.float32) is None:
            return [f"{label}: the forward of the local slice does not run in two calls"]
        if _backward_in_phases(*x[:3], x[3], None, None, None, d_local, scale, torch.float32) is None:
            return [f"{label}: the backward of the local slice does not run in two calls"]
    run_op(gate, *mine, scale=scale, cp_context=ctx)  # first call: ctx's device copies are made here
    for x in mine:
        if x is not None:
            x.grad = None
    # With cu_seqlens_cpu given, the CP op must not synchronise with the host (CUDA-graph friendly).
    torch.cuda.set_sync_debug_mode("error")
    try:
        o, _ = run_op(gate, *mine, scale=scale, cp_context=ctx)
        o.backward(d_local)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    failures, errors = [], {}
    pairs = [("o", o, o1[:, sl], ref_o[:, sl])]
    for letter, x, x1, ref in zip("qkvg", mine, one, ref_grads):
        if x is not None:
            pairs.append(("d" + letter, x.grad, x1.grad[:, sl], ref[:, sl]))
    for name, cp_out, one_out, ref in pairs:
        e_cp, e_one = rel_rms_error(cp_out, ref), rel_rms_error(one_out, ref)
        errors[name] = e_cp
        if not e_cp <= 2 * e_one + 1e-3:
            failures.append(f"{label}: {name}: CP error {e_cp:.3g} > 2 x one-GPU error {e_one:.3g}")
    report(label + " (bf16)", errors)
    return failures


def expect_error(failures, label, kind, fragment, call):
    try:
        call()
    except kind as e:
        if fragment not in str(e) or "flashgla: " not in str(e):
            failures.append(f"{label}: message {str(e)!r} lacks {fragment!r}")
        return
    except Exception as e:  # noqa: BLE001
        failures.append(f"{label}: expected {kind.__name__}, got {type(e).__name__}: {e}")
        return
    failures.append(f"{label}: no error")


def errors_suite(rank, world, device):
    import flashgla
    from flashgla.distributed import build_cp_context
    failures = []
    L = 8
    T = world * L
    cu = torch.tensor([0, 3, T], dtype=torch.int64, device=device)
    ctx = build_cp_context(cu)
    q = torch.randn(1, L, 2, 8, device=device)
    g = torch.nn.functional.logsigmoid(torch.randn(1, L, 2, 8, device=device))
    expect_error(failures, "T not divisible", ValueError, "cu_seqlens",
                 lambda: build_cp_context(torch.tensor([0, T + 1], device=device)))
    expect_error(failures, "initial_state", ValueError, "initial_state",
                 lambda: flashgla.chunk_gla(q, q, q, g, initial_state=torch.zeros(ctx.num_local_seqs, 2, 8, 8,
                                                                                   device=device), cp_context=ctx))
    # A different cu_seqlens on rank 0 only: every rank must raise, none may hang.
    differing = torch.tensor([0, 5, T] if rank == 0 else [0, 3, T], device=device)
    expect_error(failures, "cu_seqlens differ", ValueError, "differs between the ranks",
                 lambda: build_cp_context(differing))
    expect_error(failures, "conv window", ValueError, "conv1d_kernel_size",
                 lambda: build_cp_context(torch.tensor([0, 2 * world], device=device), conv1d_kernel_size=4))
    expect_error(failures, "wrong local T", ValueError, "q",
                 lambda: flashgla.chunk_gla(q[:, :L - 1], q[:, :L - 1], q[:, :L - 1], g[:, :L - 1], cp_context=ctx))
    expect_error(failures, "cu_seqlens given to the op", ValueError, "cu_seqlens",
                 lambda: flashgla.chunk_gla(q, q, q, g, cu_seqlens=cu, cp_context=ctx))
    failures += one_rank_fails_suite(rank, world, device, ctx, q, g, L)
    # After the errors the group still works: one op call on every rank, and passing ctx.cu_seqlens is fine.
    o, _ = flashgla.chunk_gla(q, q, q, g, cu_seqlens=ctx.cu_seqlens, cp_context=ctx)
    if not torch.isfinite(o).all():
        failures.append("op after the errors: non-finite output")
    # A rank whose loss uses only the final state (its o gets no gradient) still takes part in the
    # backward's all-gather: no rank hangs, and the gradients are finite.
    ctx1 = build_cp_context(torch.tensor([0, T], device=device))
    xs = [torch.randn(1, L, 2, 8, device=device).requires_grad_() for _ in range(3)]
    gg = torch.nn.functional.logsigmoid(torch.randn(1, L, 2, 8, device=device)).requires_grad_()
    o, ht = flashgla.chunk_gla(*xs, gg, output_final_state=True, cp_context=ctx1)
    (o.sum() if rank % 2 == 0 else ht.sum()).backward()
    if not all(torch.isfinite(x.grad).all() for x in (*xs, gg)):
        failures.append("output unused on some ranks: non-finite gradients")
    # The context's layout fields.
    ctx = build_cp_context(torch.tensor([0, L // 2, T], device=device), conv1d_kernel_size=4)
    expected_prev = rank > 0
    if ctx.continues_from_prev != expected_prev or ctx.continues_into_next != (rank < world - 1):
        failures.append(f"context flags: {ctx}")
    if rank > 0 and (ctx.first_seq_offset != rank * L - L // 2 or ctx.pre_num_conv_tokens != 3):
        failures.append(f"context offsets: {ctx}")
    pos = ctx.position_ids()
    if rank > 0 and pos[0].item() != rank * L - L // 2:
        failures.append(f"position_ids: {pos.tolist()}")
    return failures


def expect_every_rank_raises(failures, label, rank, bad_rank, kind, own_fragment, call):
    """call() fails on bad_rank alone: that rank raises its own error, every other rank `kind` naming bad_rank
    and carrying its message; none waits in a collective (the caller's timeout turns a hang into a failure).
    One call per rank, as the collectives inside must match."""
    try:
        call()
    except kind as e:
        text = str(e)
        wanted = [own_fragment, "flashgla: "] + ([] if rank == bad_rank else [f"rank {bad_rank} of the group failed"])
        missing = [f for f in wanted if f not in text]
        if missing:
            failures.append(f"{label} (rank {rank}): message {text!r} lacks {missing}")
        return
    except Exception as e:  # noqa: BLE001
        failures.append(f"{label} (rank {rank}): expected {kind.__name__}, got {type(e).__name__}: {e}")
        return
    failures.append(f"{label} (rank {rank}): no error")


def one_rank_fails_suite(rank, world, device, ctx, q, g, L):
    """Bad input on one rank only, in the forward and in the backward: every rank raises."""
    import flashgla
    failures = []
    last = world - 1
    # A wrong local T on the last rank.
    mine = q[:, :L - 1] if rank == last else q
    mine_g = g[:, :L - 1] if rank == last else g
    expect_every_rank_raises(failures, "wrong T on one rank", rank, last, ValueError, "each rank passes its",
                             lambda: flashgla.chunk_gla(mine, mine, mine, mine_g, cp_context=ctx))
    # initial_state on rank 0 only.
    h0 = torch.zeros(ctx.num_local_seqs, 2, 8, 8, device=device) if rank == 0 else None
    expect_every_rank_raises(failures, "initial_state on one rank", rank, 0, ValueError, "takes no initial_state",
                             lambda: flashgla.chunk_gla(q, q, q, g, initial_state=h0, cp_context=ctx))
    # A gate of the wrong shape on rank 1 (the op's own checks come first; the CP check names g).
    bad_g = g[..., :4] if rank == 1 else g
    expect_every_rank_raises(failures, "gate shape on one rank", rank, 1, ValueError, "g",
                             lambda: flashgla.chunk_gla(q, q, q, bad_g, cp_context=ctx))
    # v in another dtype on rank 0.
    bad_v = q.double() if rank == 0 else q
    expect_every_rank_raises(failures, "dtype on one rank", rank, 0, ValueError, "one dtype",
                             lambda: flashgla.chunk_gla(q, q, bad_v, g, cp_context=ctx))
    # normalize on rank 0 only (it would add a collective there): every rank raises, naming the options.
    text = None
    try:
        flashgla.chunk_linear_attn(q, q, q, normalize=rank == 0, cp_context=ctx)
    except ValueError as e:
        text = str(e)
    if text is None or "different options" not in text or "rank 0 with normalize" not in text:
        failures.append(f"normalize on one rank (rank {rank}): {text!r}")
    # g_gamma on one rank only.
    sg = g[..., 0].contiguous()
    gamma = torch.full((2,), -0.1, device=device) if rank == world - 1 else None
    expect_error(failures, "g_gamma on one rank", ValueError, "different options",
                 lambda: flashgla.chunk_simple_gla(q, q, q, sg, g_gamma=gamma, cp_context=ctx))
    # g_gamma of the wrong length on rank 1.
    gamma = torch.full((3 if rank == 1 else 2,), -0.1, device=device)
    sg = g[..., 0].contiguous()
    expect_every_rank_raises(failures, "g_gamma on one rank", rank, 1, ValueError, "g_gamma",
                             lambda: flashgla.chunk_simple_gla(q, q, q, sg, g_gamma=gamma, cp_context=ctx))
    # The backward: a fault injected into the last rank's pre-pass (user input cannot reach it: autograd
    # checks the gradients' shapes first).
    import flashgla.distributed as fd
    ctx1 = fd.build_cp_context(torch.tensor([0, world * L], device=device))
    xs = [x.detach().clone().requires_grad_() for x in (q, q, q)]
    o, _ = flashgla.chunk_gla(*xs, g, cp_context=ctx1)
    real = fd._segment_state_grads, fd._backward_in_phases  # the pre-pass: its own, or the op's summary call

    def injected(*args, **kwargs):
        raise RuntimeError("flashgla: injected fault in the pre-pass")

    if rank == last:
        fd._segment_state_grads = fd._backward_in_phases = injected
    try:
        expect_every_rank_raises(failures, "fault in the backward on one rank", rank, last, RuntimeError,
                                 "injected fault", lambda: o.backward(torch.ones_like(o), retain_graph=True))
    finally:
        fd._segment_state_grads, fd._backward_in_phases = real
    return failures


def worker(rank, world, backend, port, suite, result_dir):
    os.environ.setdefault("FLASHGLA_NUM_THREADS", "1")
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        failures, lines = [], []
        if suite in ("numerics", "all"):
            dtypes = (torch.float64, torch.float32) if backend == "gloo" else (torch.bfloat16,)
            failures, lines = numerics(rank, world, device, dtypes)
        if suite in ("errors", "all"):
            failures += errors_suite(rank, world, device)
            lines.append("  bad-input suite: done")
        with open(os.path.join(result_dir, f"rank{rank}.txt"), "w") as f:
            f.write("\n".join(lines) + "\n")
            for line in failures:
                f.write("FAIL " + line + "\n")
    except BaseException:
        dist.destroy_process_group()
        raise
    leave_group_and_exit()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--backend", default="gloo")
    parser.add_argument("--suite", default="all", choices=["numerics", "errors", "all"])
    parser.add_argument("--out", required=True, help="folder for each rank's report")
    args = parser.parse_args()
    mp.spawn(worker, args=(args.world, args.backend, free_port(), args.suite, args.out), nprocs=args.world)
    failed = False
    for r in range(args.world):
        text = open(os.path.join(args.out, f"rank{r}.txt")).read()
        print(f"rank {r}:\n{text}")
        failed |= "FAIL " in text
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
