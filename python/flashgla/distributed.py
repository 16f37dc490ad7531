"""Context parallelism (CP) for the chunked GLA ops, over torch.distributed.

Each rank of a process group holds a contiguous slice of T/P tokens of the
packed ``[1, T, H, D]`` batch (or of every row of a fixed-length ``[B, T, H, D]``
batch) and calls the op on it with ``cp_context=``::

    ctx = build_cp_context(cu_seqlens, group)          # global boundaries, once per batch
    lo = ctx.token_offset; hi = lo + ctx.local_tokens
    o, _ = chunk_gla(q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], g[:, lo:hi], cp_context=ctx)

Outputs and gradients equal one process running the op on the whole batch.
GLA's rank-to-rank transition is a per-key diagonal (see
docs/context_parallel.md), so a pass costs one all-gather of a fixed-size
summary per rank: the forward sends the end state from zero S and the summed
log gate a of the rank's last local sequence, ``[B, H, K, V+1]``; the backward
the entering-state gradient B of its first local sequence, ``[B, H, K, V]``.
Each rank folds the summaries of the ranks its sequence spans
(``flashgla._C.gla_fold_states``, C++/CUDA) and runs its ordinary chunked op
with that entering state (forward) or end-state gradient (backward).

Every collective sits inside one autograd Function and communicates on every
rank whatever the local data (same shapes everywhere, never an empty tensor),
so no rank waits on another that skipped it. A rank whose input is bad (or
whose pre-pass fails) still takes part, with an error flag and its message
after its summary, and every rank raises after the all-gather
(``agree_on_errors``, docs/context_parallel.md "Faults"); each rank must backpropagate
through the op's output (as with any collective in autograd). Given a
``cu_seqlens_cpu``, nothing reads device memory back, so the op's forward and
backward can be captured in a CUDA graph (with the context built outside it).

Besides the GLA op, three things of a GLA model cross rank boundaries (the
layer pieces below, used by flashgla.nn and flashgla.models):

- the short convolution: rank r needs the last W-1 input rows of rank r-1 (zero where a sequence
  starts at rank r's first token), and sends their gradient back (`exchange_halo`);
- softmax attention: every query needs the keys and values of its sequence up to itself, so K and V
  are all-gathered (their gradients summed back over the ranks) and each rank attends with its
  local queries over the keys up to its own end (`gather_keys_values`);
- the loss: each rank sums its tokens' losses and divides by the all-reduced count of valid tokens
  (`cp_mean_loss`).

Their collectives follow the same rule as the op's: a rank whose data does not need a neighbour's
rows still takes part.

The model across GPUs otherwise (FSDP2, DCP checkpoints) is flashgla.parallel.
"""

import contextlib
from dataclasses import dataclass, field
from typing import Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

from . import _C
from ._torch import make_args, run_op
from .ops.gla import (_backward_in_phases, _forward_in_phases, _run_backward_all, _run_forward,
                      chunk_gla_segment_state_grads, chunk_gla_segment_states)

__all__ = ["CPContext", "build_cp_context", "exchange_halo", "conv_with_halo", "gather_keys_values", "cp_mean_loss",
           "attention_layout", "check_cp_context", "next_token_targets", "local_slice"]

# torch 2.13 renamed all_gather_into_tensor (older releases have only that name).
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass
class CPContext:
    """What one rank knows about the token layout of a context-parallel batch.

    Built by :func:`build_cp_context` on every rank of ``group``; read-only
    afterwards. "Local" means this rank's slice, ``[token_offset, token_offset +
    local_tokens)`` of the global token index; a "local sequence" is the part of
    a sequence that lies in that slice.

    Fields (stable; layers and models build on them):

    - ``group``: the process group; ``rank`` / ``world_size``: this rank's index
      in the group and the group's size (group ranks, never global ranks).
    - ``cu_seqlens``: local boundaries ``[N_local + 1]`` (first 0, last
      ``local_tokens``; dtype and device of the global ``cu_seqlens``); what the
      op passes to the local kernels. ``cu_seqlens_cpu``: the same on the CPU.
    - ``global_cu_seqlens`` / ``global_cu_seqlens_cpu``: the boundaries given.
    - ``total_tokens`` (T), ``local_tokens`` (T / P), ``token_offset`` (global
      index of the first local token = rank · T / P).
    - ``first_seq_offset``: position, within its sequence, of the first local
      token (0 when a sequence starts there); with ``position_ids()`` it gives
      RoPE positions.
    - ``continues_from_prev``: the first local sequence started on an earlier
      rank; ``continues_into_next``: the last local sequence goes on after this
      rank. ``pre_num_ranks`` / ``post_num_ranks``: how many earlier / later
      ranks those sequences span (FLA's names); ``is_first_rank`` /
      ``is_last_rank``: this rank holds the start / the end of its first / last
      local sequence.
    - ``first_seq_end``: local index where the first local sequence ends;
      ``last_seq_start``: local index where the last local sequence starts.
    - ``num_local_seqs`` (N_local), ``num_seqs`` (N, global).
    - ``conv1d_kernel_size`` (W or None) and ``pre_num_conv_tokens``: how many
      rows of the previous rank a causal convolution of width W needs, min(W −
      1, first_seq_offset) (0 when the first local sequence starts here).
    - ``fold_forward`` / ``fold_backward``: the ranks ``(begin, end)`` whose
      summaries the forward / backward folds (``begin == end``: none).
    - ``agree_on_errors``: the CP ops read every rank's error flag after each
      pass's all-gather, so that an error on one rank is raised on all (see
      :func:`build_cp_context`).
    """

    group: object
    rank: int
    world_size: int
    cu_seqlens: Tensor
    cu_seqlens_cpu: Tensor
    global_cu_seqlens: Tensor
    global_cu_seqlens_cpu: Tensor
    total_tokens: int
    local_tokens: int
    token_offset: int
    first_seq_offset: int
    continues_from_prev: bool
    continues_into_next: bool
    pre_num_ranks: int
    post_num_ranks: int
    first_seq_end: int
    last_seq_start: int
    num_local_seqs: int
    num_seqs: int
    conv1d_kernel_size: Optional[int]
    pre_num_conv_tokens: int
    fold_forward: Tuple[int, int]
    fold_backward: Tuple[int, int]
    agree_on_errors: bool = True
    _device_cu_seqlens: dict = field(default_factory=dict, repr=False)
    _position_ids: dict = field(default_factory=dict, repr=False)

    @property
    def is_first_rank(self) -> bool:
        return not self.continues_from_prev

    @property
    def is_last_rank(self) -> bool:
        return not self.continues_into_next

    def local_cu_seqlens(self, device) -> Tensor:
        """ctx.cu_seqlens on `device` (copied once, then cached)."""
        device = torch.device(device)
        if self.cu_seqlens.device == device:
            return self.cu_seqlens
        if device not in self._device_cu_seqlens:
            self._device_cu_seqlens[device] = self.cu_seqlens.to(device)
        return self._device_cu_seqlens[device]

    def local_op_cu_seqlens(self, q: Tensor):
        """(cu_seqlens, cu_seqlens_host) for the ordinary op on this rank's slice q: none for a fixed-length batch
        (B > 1 rows) and where the [1, T_local] slice is one sequence, so that the op plans it as a fixed-length
        batch of one (the backward splits the state scans of one long sequence only then)."""
        if q.shape[0] != 1 or (self.num_local_seqs == 1 and self.local_tokens > 0):
            return None, None
        return self.local_cu_seqlens(q.device), (self.cu_seqlens_cpu if q.is_cuda else None)

    def position_ids(self, device=None) -> Tensor:
        """[local_tokens] int64: each local token's position within its sequence (for RoPE)."""
        device = torch.device(device) if device is not None else self.cu_seqlens.device
        if device not in self._position_ids:
            cu = self.cu_seqlens_cpu.to(torch.int64)
            lengths = cu[1:] - cu[:-1]
            starts = torch.repeat_interleave(cu[:-1], lengths)
            positions = torch.arange(self.local_tokens, dtype=torch.int64) - starts
            positions[: self.first_seq_end] += self.first_seq_offset
            self._position_ids[device] = positions.to(device)
        return self._position_ids[device]

    def run_chunked_op(self, op_name, q, k, v, g, scale, initial_state, output_final_state, cu_seqlens,
                       cu_seqlens_host, state_v_first=False, g_gamma=None, normalize=False):
        """chunk_gla / chunk_simple_gla / chunk_linear_attn with cp_context=self: what those ops call (so that
        they need not import this module, which builds on them)."""
        return cp_chunk(op_name, q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, cu_seqlens_host,
                        self, state_v_first=state_v_first, g_gamma=g_gamma, normalize=normalize)

    def run_normalize(self, o_raw, q, k, scale):
        """chunk_linear_attn(normalize=True) with cp_context=self: the normaliser over the group's running key
        sums, (o, z_state of the local sequences [N_local, 1, H, K])."""
        return _NormalizeCP.apply(o_raw, q, k, scale, self)


def _group_device(group):
    """Where the group's collectives want their tensors: the current CUDA device for NCCL, else the CPU."""
    backend = dist.get_backend(group)
    if "nccl" in str(backend).lower():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _checksum(cu):
    """Four int64 numbers that differ, with near certainty, when two cu_seqlens differ."""
    values = [int(x) for x in cu]
    h1, h2 = 0, 0
    modulus = (1 << 61) - 1
    for i, x in enumerate(values):
        h1 = (h1 * 1000003 + x + 1) % modulus
        h2 = (h2 + (i + 1) * (x + 7) * (x + 13)) % modulus
    return [len(values), values[-1], h1, h2]


def build_cp_context(cu_seqlens: Tensor, group=None, conv1d_kernel_size: Optional[int] = None,
                     cu_seqlens_cpu: Optional[Tensor] = None, *, check: bool = True,
                     agree_on_errors: bool = True) -> CPContext:
    """The context-parallel layout of one batch, for this rank of `group`.

    cu_seqlens: global boundaries ``[N + 1]`` int32/int64 of the packed batch
    (``0 = c0 ≤ … ≤ cN = T``); for a fixed-length batch ``[B, T, H, D]`` pass
    ``[0, T]`` (every row one sequence spanning all ranks). T must be divisible
    by the group's size P; rank r holds tokens ``[r·T/P, (r+1)·T/P)``.
    group: the process group (default: the world). conv1d_kernel_size: width W
    of a causal convolution run under CP; every rank must hold at least W − 1
    tokens. cu_seqlens_cpu: a CPU copy of a CUDA cu_seqlens (nothing is then
    read back from the device). check: compare cu_seqlens across the group
    (one small all-gather; a mismatch raises ValueError on every rank).
    agree_on_errors: a CP op that fails on one rank (bad input there, an error
    in its pre-pass) still takes part in the pass's all-gather with an error
    flag and its message, and every rank raises after it (the others a
    RuntimeError, or the same ValueError/TypeError/NotImplementedError, naming
    the failing rank and its message) instead of waiting for it in a
    collective. Free on gloo; on NCCL reading the P flags back is one small
    device-to-host copy per pass, a stream synchronisation. False skips that
    read (e.g. for CUDA-graph capture): then a rank that fails alone leaves
    the others to the backend's timeout.

    A collective when `check` is true: call it on every rank of the group.
    """
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("flashgla: group: torch.distributed is not initialized (call init_process_group first)")
    if group is None:
        group = dist.group.WORLD
    if not isinstance(cu_seqlens, Tensor):
        raise TypeError(f"flashgla: cu_seqlens: expected a torch.Tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype not in (torch.int32, torch.int64) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError("flashgla: cu_seqlens: expected a 1-D int32/int64 tensor [N + 1] with N >= 1, got "
                         f"{cu_seqlens.dtype} of shape {list(cu_seqlens.shape)}")
    if cu_seqlens_cpu is not None:
        if not isinstance(cu_seqlens_cpu, Tensor) or cu_seqlens_cpu.device.type != "cpu":
            raise ValueError("flashgla: cu_seqlens_cpu: expected a CPU tensor (a copy of cu_seqlens)")
        if cu_seqlens_cpu.shape != cu_seqlens.shape:
            raise ValueError(f"flashgla: cu_seqlens_cpu: expected the shape of cu_seqlens {list(cu_seqlens.shape)}, "
                             f"got {list(cu_seqlens_cpu.shape)}")
        host = cu_seqlens_cpu.to(torch.int64)
    else:
        host = cu_seqlens.detach().to("cpu", torch.int64)  # reads the device once, when building the context
    bounds = host.tolist()
    if bounds[0] != 0 or any(b < a for a, b in zip(bounds, bounds[1:])):
        raise ValueError(f"flashgla: cu_seqlens: expected 0 = c0 <= c1 <= ... <= cN, got {bounds[:8]}"
                         f"{' ...' if len(bounds) > 8 else ''}")

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if rank < 0:
        raise ValueError("flashgla: group: this process is not a member of the group")
    total = bounds[-1]

    if check:
        # Every rank sends four numbers, so a mismatch is seen by all ranks at once (no rank hangs in a
        # later collective of a different shape), and all raise the same error.
        device = _group_device(group)
        mine = torch.tensor(_checksum(bounds), dtype=torch.int64, device=device)
        every = torch.empty(world * 4, dtype=torch.int64, device=device)
        _all_gather_single(every, mine, group=group)
        every = every.view(world, 4).cpu().tolist()
        different = [r for r in range(world) if every[r] != every[0]]
        if different:
            raise ValueError("flashgla: cu_seqlens: differs between the ranks of the group (rank 0 has "
                             f"{every[0][0] - 1} sequences of {every[0][1]} tokens, rank {different[0]} "
                             f"{every[different[0]][0] - 1} of {every[different[0]][1]}); every rank must pass the "
                             "global boundaries of the same batch")

    if total % world != 0 or total == 0:
        raise ValueError(f"flashgla: cu_seqlens: the batch's {total} tokens do not split evenly over the "
                         f"{world} ranks of the group (expected a positive multiple of {world}; pad the batch)")
    local = total // world
    if conv1d_kernel_size is not None:
        if int(conv1d_kernel_size) < 1:
            raise ValueError(f"flashgla: conv1d_kernel_size: expected >= 1, got {conv1d_kernel_size}")
        if local < int(conv1d_kernel_size) - 1:
            raise ValueError(f"flashgla: conv1d_kernel_size: a convolution of width {conv1d_kernel_size} needs "
                             f"{int(conv1d_kernel_size) - 1} rows of the previous rank, but each rank holds only "
                             f"{local} tokens ({total} over {world} ranks)")

    boundary = set(bounds)

    def starts_at(j):  # rank j's first token starts a sequence
        return j == 0 or j * local in boundary

    def whole(j):  # no sequence boundary strictly inside rank j
        return not any(j * local < b < (j + 1) * local for b in boundary)

    begin, end = rank * local, (rank + 1) * local
    inner = sorted(b - begin for b in boundary if begin < b < end)
    local_bounds = [0] + inner + [local]
    first_seq_end, last_seq_start = local_bounds[1], local_bounds[-2]
    seq_start = max(b for b in bounds if b <= begin)
    first_seq_offset = begin - seq_start

    # Forward: the state entering this rank comes from rank-1's last local sequence, which itself
    # started from rank-2's when rank-1 is one piece of a sequence continuing from rank-2, and so on.
    if starts_at(rank):
        fold_forward = (rank, rank)
    else:
        lo = rank - 1
        while not starts_at(lo) and whole(lo):
            lo -= 1
        fold_forward = (lo, rank)
    # Backward: the mirror, towards the last rank.
    if rank + 1 >= world or starts_at(rank + 1):
        fold_backward = (rank + 1, rank + 1)
    else:
        hi = rank + 1
        while hi + 1 < world and whole(hi) and not starts_at(hi + 1):
            hi += 1
        fold_backward = (rank + 1, hi + 1)

    pre = rank - fold_forward[0] if fold_forward[0] < fold_forward[1] else 0
    post = fold_backward[1] - fold_backward[0]
    local_cpu = torch.tensor(local_bounds, dtype=torch.int64)
    local_device = torch.tensor(local_bounds, dtype=cu_seqlens.dtype).to(cu_seqlens.device)
    width = None if conv1d_kernel_size is None else int(conv1d_kernel_size)
    halo = 0 if (width is None or starts_at(rank)) else min(width - 1, first_seq_offset)
    return CPContext(
        group=group, rank=rank, world_size=world, cu_seqlens=local_device, cu_seqlens_cpu=local_cpu,
        global_cu_seqlens=cu_seqlens, global_cu_seqlens_cpu=host, total_tokens=total, local_tokens=local,
        token_offset=begin, first_seq_offset=first_seq_offset, continues_from_prev=not starts_at(rank),
        continues_into_next=rank + 1 < world and not starts_at(rank + 1), pre_num_ranks=pre, post_num_ranks=post,
        first_seq_end=first_seq_end, last_seq_start=last_seq_start, num_local_seqs=len(local_bounds) - 1,
        num_seqs=len(bounds) - 1, conv1d_kernel_size=width, pre_num_conv_tokens=halo, fold_forward=fold_forward,
        fold_backward=fold_backward, agree_on_errors=bool(agree_on_errors))


# ---- timing hook for benchmarks ------------------------------------------------------

# A benchmark sets this to a callable name -> context manager (e.g. recording CUDA events) to time
# the phases "prepass", "allgather", "fold" and "local" of each pass; None costs nothing.
phase_timer = None


def _phase(name):
    return phase_timer(name) if phase_timer is not None else contextlib.nullcontext()


# ---- the pieces ------------------------------------------------------------------------

def _all_gather(out, tensor, group):
    """out [P, *tensor.shape] ← every rank's tensor (gloo wants the ranks stacked along dimension 0)."""
    _all_gather_single(out.view(-1, *tensor.shape[1:]), tensor, group=group)


# Every pass's all-gather carries, after the summary, a status: a flag, the options that decide what the ranks
# do next (they must agree: normalize adds a collective), and the first bytes of the error message of a rank
# that failed before the collective (bytes are exact as fp32/fp64 values).
_MESSAGE_BYTES = 480
_STATUS = 2 + _MESSAGE_BYTES
# (a rank's state layout or final states are its own affair; these change the computation or its collectives)
_OPTIONS = ("gate g", "g_gamma", "normalize")


def _options_code(**given):
    """The options as bits, in _OPTIONS' order (given by name, spaces as underscores)."""
    return sum(1 << i for i, name in enumerate(_OPTIONS) if given.get(name.replace(" ", "_")))
_ERROR_TYPES = {"ValueError": ValueError, "TypeError": TypeError, "NotImplementedError": NotImplementedError}

def _gather_and_agree(send, n, cp, op_name, error):
    """A CP pass's one all-gather of every rank's row (n summary values, then the _STATUS values), on every rank,
    then the error agreement: [P, n + _STATUS], or every rank raises."""
    gathered = torch.empty(cp.world_size, n + _STATUS, dtype=send.dtype, device=send.device)
    with _phase("allgather"):
        _all_gather(gathered, send, cp.group)
    _agree(gathered[:, n:], cp, op_name, error)
    return gathered


def _write_status(status, error, options=0):
    """status [_STATUS] (zeros) <- the flag and message of `error` (None: no error) and the options' code.
    fill_ with a number is a kernel launch; an item assignment would copy from the host (a sync on CUDA)."""
    if options:
        status[1:2].fill_(options)
    if error is None:
        return
    text = f"{type(error).__name__}: {error}".encode("utf-8", "replace")[:_MESSAGE_BYTES]
    status[0:1].fill_(1)
    if text:
        status[2:2 + len(text)].copy_(torch.tensor(list(text), dtype=status.dtype))


def _agree(statuses, cp, op_name, own_error):
    """After a pass's all-gather: this rank re-raises its own error; the others raise the first failed rank's
    (statuses [P, _STATUS]). Reading the flags is a device-to-host copy on CUDA (see agree_on_errors)."""
    if own_error is not None:
        raise own_error
    if not cp.agree_on_errors:
        return
    heads = statuses[:, :2].cpu().tolist()
    failed = [j for j, (flag, _) in enumerate(heads) if flag != 0]
    if not failed:
        codes = [int(code) for _, code in heads]
        if any(c != codes[0] for c in codes):
            j = next(j for j, c in enumerate(codes) if c != codes[0])

            def named(code):
                return ", ".join(n for i, n in enumerate(_OPTIONS) if code >> i & 1) or "none of them"
            raise ValueError(f"flashgla: cp_context: the ranks of the group called {op_name} with different options "
                             f"(of {', '.join(_OPTIONS)}): rank 0 with {named(codes[0])}, rank {j} with "
                             f"{named(codes[j])}; every rank must pass the same")
        return
    j = failed[0]
    raw = bytes(int(x) for x in statuses[j, 2:].cpu().tolist() if x != 0).decode("utf-8", "replace")
    kind, _, message = raw.partition(": ")
    others = f" (and ranks {failed[1:]})" if len(failed) > 1 else ""
    raise _ERROR_TYPES.get(kind, RuntimeError)(
        f"flashgla: cp_context: rank {j}{others} of the group failed in {op_name}, so every rank stops here: "
        f"{kind}: {message}")


def _fold(states, log_decay, begin, end, reverse, out, initial=None, accumulate=False):
    """out (=|+=) fold of h ← diag(exp a_j) h + S_j over ranks begin..end-1, in C++/CUDA.
    states [P, M, K, V], log_decay [P, M, K], out / initial [M, K, V]; any strides."""
    args = make_args(_C.GlaFoldStatesArgs, states=states, log_decay=log_decay, begin=int(begin), end=int(end),
                     reverse=bool(reverse), initial=initial, accumulate=bool(accumulate), out=out)
    run_op(_C.gla_fold_states, args, out.device, scratch=False)


def _segment_states(k, v, g, g_gamma=None):
    """(S [B, H, K, V], a [B, H, K]) of each row from a zero state; the gate g + g_gamma, summed in C++/CUDA as
    the local op sums it, so that the summaries see the local op's gate bit for bit."""
    return chunk_gla_segment_states(k, v, g, g_gamma=g_gamma)


def _segment_state_grads(q, do, g, scale, g_gamma=None):
    """B [B, H, K, V] of each row: the entering-state gradient for a zero end-state gradient."""
    return chunk_gla_segment_state_grads(q, do, g, scale=scale, g_gamma=g_gamma)


def _first_rows(t, varlen):
    """The state rows of the first local sequence(s) as [M, K, V]: row 0 (varlen) or all rows; a view (the fold
    writes through it) when t's rows merge without a copy, as for t or its transpose when freshly allocated."""
    rows = t[:1] if varlen else t
    return rows.reshape(-1, t.shape[2], t.shape[3])


def _last_rows(t, varlen):
    rows = t[-1:] if varlen else t
    return rows.reshape(-1, t.shape[2], t.shape[3])


def _kv(state, state_v_first):
    """A state tensor in the fold's [..., K, V] layout (a view; the transpose of a V-first one)."""
    return state.transpose(-1, -2) if state_v_first else state


def _state_rows(rows, H, K, V, dtype, device, state_v_first):
    """Zeros [rows, H, K, V] ([rows, H, V, K] with state_v_first), as the local op takes them."""
    shape = (rows, H, V, K) if state_v_first else (rows, H, K, V)
    return torch.zeros(shape, dtype=dtype, device=device)


def _check_local_inputs(op_name, q, k, v, g, initial_state, cu_seqlens, cu_seqlens_host, cp):
    """What a rank can get wrong alone, checked before the pass's all-gather (so that its error is agreed on)."""
    if initial_state is not None:
        raise ValueError(f"flashgla: initial_state: {op_name} with cp_context takes no initial_state (the state "
                         "entering each rank comes from the previous ranks); start each sequence from zero")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"flashgla: q: expected q, k [B, T, H, K] and v [B, T, H, V], got shapes "
                         f"{list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    check_cp_context(cp, q, "q")
    if k.shape != q.shape or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"flashgla: k: expected k of q's shape {list(q.shape)} and v [B, T, H, V] with q's B, T, "
                         f"H, got k {list(k.shape)}, v {list(v.shape)}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"flashgla: k: expected q, k, v of one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if g is not None:
        gate_shape = q.shape if op_name == "chunk_gla" else q.shape[:3]
        if g.shape != gate_shape:
            raise ValueError(f"flashgla: g: {op_name} with cp_context expects g of shape {list(gate_shape)}, got "
                             f"{list(g.shape)}")
    for name, t in (("k", k), ("v", v), ("g", g)):
        if t is not None and t.device != q.device:
            raise ValueError(f"flashgla: {name}: expected the device of q ({q.device}), got {t.device}")
    if cu_seqlens is not None and cu_seqlens is not cp.cu_seqlens:
        local = cp.cu_seqlens_cpu
        given = cu_seqlens.detach().to("cpu", torch.int64)
        if given.shape != local.shape or not torch.equal(given, local):
            raise ValueError("flashgla: cu_seqlens: with cp_context the op takes the local boundaries from the "
                             f"context: leave cu_seqlens out or pass ctx.cu_seqlens ({local.tolist()[:8]}), got "
                             f"{given.tolist()[:8]}")
    if cu_seqlens_host is not None:
        given = cu_seqlens_host.detach().to(torch.int64)
        if given.shape != cp.cu_seqlens_cpu.shape or not torch.equal(given, cp.cu_seqlens_cpu):
            raise ValueError("flashgla: cu_seqlens_host: with cp_context leave it out or pass ctx.cu_seqlens_cpu")


def _check_gamma(g_gamma, q):
    if g_gamma is None:
        return
    if g_gamma.dim() != 1 or q.dim() != 4 or g_gamma.shape[0] != q.shape[2]:
        raise ValueError(f"flashgla: g_gamma: expected one log decay per head [H] (H = {q.shape[2]}), got shape "
                         f"{list(g_gamma.shape)}")
    if g_gamma.device != q.device:
        raise ValueError(f"flashgla: g_gamma: expected the device of q ({q.device}), got {g_gamma.device}")


def _rows(g, begin, end):
    """Tokens [begin, end) of the gate (a view), None without one."""
    return None if g is None else g[:, begin:end]


def _payload_dims(q, v):
    """(B, H, K, V) of the pass's summary. From q and v alone, so that a rank whose other inputs are wrong still
    sends what the others expect (only q or v of another rank's dimensions would make the sizes differ)."""
    if q.dim() == 4 and v.dim() == 4:
        return q.shape[0], q.shape[2], q.shape[3], v.shape[3]
    return 1, 1, 1, 1


class _ChunkGlaCP(torch.autograd.Function):
    """chunk_gla on this rank's slice, with the state carried across ranks (see the module docstring)."""

    @staticmethod
    def forward(fctx, q, k, v, g, g_gamma, scale, cp, output_final_state, state_v_first, op_name, checks, normalize):
        B, H, K, V = _payload_dims(q, v)
        varlen = B == 1
        state_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        P = cp.world_size

        # 1. This rank's summary: S and a of its last local sequence, packed as [B, H, K, V+1], then the status.
        n = B * H * K * (V + 1)
        send = torch.zeros(n + _STATUS, dtype=state_dtype, device=q.device)
        summary = send[:n].view(B, H, K, V + 1)
        first_decay = None  # a of the first local sequence: carries its end state's gradient to its start
        error = None
        phases = None  # (summaries, output call) of the local op in two calls, where its split gives them
        cu = cu_host = None
        with _phase("prepass"):
            try:
                _check_local_inputs(op_name, q, k, v, g, *checks, cp)
                _check_gamma(g_gamma, q)
                cu, cu_host = cp.local_op_cu_seqlens(q)
                if cu is None:  # one sequence per row: its summary from the op's own split pass
                    phases = _forward_in_phases(q, k, v, g, cu, cu_host, scale, output_final_state, state_dtype,
                                                g_gamma=g_gamma, state_v_first=state_v_first, op=op_name)
                if phases is not None:  # every local sequence's summary: the last one's is sent
                    local = phases[0]
                    if cp.continues_into_next:
                        summary.copy_(local[-1:] if varlen else local)
                    if output_final_state and cp.continues_from_prev:
                        first_decay = (local[:1] if varlen else local)[..., V]
                if phases is None and cp.continues_into_next:  # else no rank folds it: send zeros
                    s0 = cp.last_seq_start
                    states, log_decay = _segment_states(k[:, s0:], v[:, s0:], _rows(g, s0, None), g_gamma)
                    summary[..., :V].copy_(states)
                    summary[..., V].copy_(log_decay)
                    if s0 == 0:
                        first_decay = log_decay
                if output_final_state and cp.continues_from_prev and first_decay is None:
                    e = cp.first_seq_end
                    _, first_decay = _segment_states(k[:, :e], v[:, :e], _rows(g, 0, e), g_gamma)
            except Exception as exc:  # noqa: BLE001 - raised after the all-gather, on every rank
                error = exc
        _write_status(send[n:], error, _options_code(gate_g=g is not None, g_gamma=g_gamma is not None,
                                                     normalize=normalize))
        # 2. One all-gather, on every rank, then the error agreement.
        gathered = _gather_and_agree(send, n, cp, op_name, error)
        packed = gathered[:, :n].view(P, B * H, K, V + 1)
        # 3. The state entering the first local sequence.
        h0 = None
        begin, end = cp.fold_forward
        if begin < end:
            with _phase("fold"):
                rows = cp.num_local_seqs if varlen else B
                h0 = _state_rows(rows, H, K, V, state_dtype, q.device, state_v_first)
                _fold(packed[..., :V], packed[..., V], begin, end, False, _first_rows(_kv(h0, state_v_first), varlen))
        # 4. The ordinary chunked forward on the local slice (its output call, after the summary call).
        with _phase("local"):
            if phases is not None:
                o, ht = phases[1](h0)
            else:
                o, ht = _run_forward(_C.GlaAlgorithm.chunked, q, k, v, g, h0, cu, cu_host, scale, False,
                                     output_final_state, state_dtype, g_gamma=g_gamma, state_v_first=state_v_first)

        fctx.save_for_backward(q, k, v, g, h0, g_gamma)
        fctx.log_decay = packed[..., V].clone()  # [P, B·H, K]: the backward's decays (no second gather)
        fctx.first_decay = None if first_decay is None else first_decay.reshape(1, B * H, K)
        fctx.scale, fctx.cp, fctx.varlen, fctx.state_dtype = scale, cp, varlen, state_dtype
        fctx.output_final_state, fctx.state_v_first, fctx.op_name = output_final_state, state_v_first, op_name
        fctx.set_materialize_grads(False)
        return o, ht  # the ops' state dtype: fp32, fp64 for fp64 inputs

    @staticmethod
    def backward(fctx, do, dht):
        q, k, v, g, h0, g_gamma = fctx.saved_tensors
        cp, varlen, state_dtype, vfirst = fctx.cp, fctx.varlen, fctx.state_dtype, fctx.state_v_first
        B, T, H, K = q.shape
        V = v.shape[3]
        P = cp.world_size
        log_decay = fctx.log_decay

        # 1. This rank's summary: B of its first local sequence, plus the gradient given to that
        # sequence's local end state (an output when output_final_state) carried to its start; then the status.
        n = B * H * K * V
        send = torch.zeros(n + _STATUS, dtype=state_dtype, device=q.device)
        summary = send[:n].view(B, H, K, V)
        error = None
        phases = None  # (summaries, output call) of the local backward in two calls, where its split gives them
        cu = cu_host = None
        with _phase("prepass"):
            try:
                cu, cu_host = cp.local_op_cu_seqlens(q)
                if do is None:  # the output was unused here; the other ranks still need this rank's summary
                    do = torch.zeros(v.shape, dtype=q.dtype, device=q.device)
                if dht is not None:
                    dht = _kv(dht, vfirst).to(state_dtype)  # [N, H, K, V] (a view where it can be)
                if cu is None:  # one sequence per row (the fold then touches the rows the summary is of)
                    phases = _backward_in_phases(q, k, v, g, h0, cu, cu_host, do, fctx.scale, state_dtype,
                                                 g_gamma=g_gamma, state_v_first=vfirst,
                                                 op=fctx.op_name + " (backward)")
                if cp.continues_from_prev:  # else no rank folds it: send zeros
                    e = cp.first_seq_end
                    if phases is not None:  # every local sequence's: the first one's is sent
                        d_states = phases[0][:1] if varlen else phases[0]
                    else:
                        d_states = _segment_state_grads(q[:, :e], do[:, :e], _rows(g, 0, e), fctx.scale, g_gamma)
                    if dht is not None:
                        M = B * H
                        _fold(d_states.reshape(1, M, K, V), fctx.first_decay, 0, 1, False, summary.view(M, K, V),
                              initial=_first_rows(dht, varlen))
                    else:
                        summary.copy_(d_states)
            except Exception as exc:  # noqa: BLE001 - raised after the all-gather, on every rank
                error = exc
                _write_status(send[n:], error)
        # 2. One all-gather, on every rank, then the error agreement.
        gathered = _gather_and_agree(send, n, cp, fctx.op_name + " (backward)", error)
        # 3. The gradient of the last local sequence's end state (in the local op's layout).
        begin, end = fctx.cp.fold_backward
        d_end = None
        if begin < end or dht is not None:
            with _phase("fold"):
                rows = cp.num_local_seqs if varlen else B
                d_end = _state_rows(rows, H, K, V, state_dtype, q.device, vfirst)
                if dht is not None:
                    _kv(d_end, vfirst).copy_(dht)
                if begin < end:
                    _fold(gathered[:, :n].view(P, B * H, K, V), log_decay, begin, end, True,
                          _last_rows(_kv(d_end, vfirst), varlen), accumulate=True)
        # 4. The ordinary chunked backward on the local slice (its output call, after the summary call).
        with _phase("local"):
            if phases is not None:
                dq, dk, dv, dg, d_gamma = phases[1](d_end)
            else:
                dq, dk, dv, dg, _, d_gamma = _run_backward_all(_C.GlaAlgorithm.chunked, q, k, v, g, h0, cu, cu_host,
                                                               do, d_end, fctx.scale, False, False, state_dtype,
                                                               g_gamma=g_gamma, state_v_first=vfirst)
        # d_g_gamma: this rank's tokens' share (the paths through the other ranks included, as for dg); the
        # full gradient is the sum over the group, as for any parameter shared by the ranks.
        d_gamma = d_gamma.to(g_gamma.dtype) if g_gamma is not None else None
        return dq, dk, dv, (dg if g is not None else None), d_gamma, None, None, None, None, None, None, None


class _NormalizeCP(torch.autograd.Function):
    """linear attention's normaliser o = o_raw / (scale q·z + 1e-10) on this rank's slice, with the running key
    sum z carried across ranks: the same all-gather and fold as the state's, of the key sum [B, H, K] of the last
    local sequence (a summary with V = 1 and no decay)."""

    @staticmethod
    def forward(fctx, o_raw, q, k, scale, cp):
        from .ops.gla import _linear_attn_normalize, _summary_dtype
        B, T, H, K = q.shape
        varlen = B == 1
        dtype = _summary_dtype(q)
        P, n = cp.world_size, B * H * K
        send = torch.zeros(n + _STATUS, dtype=dtype, device=q.device)
        error = None
        with _phase("prepass"):
            try:
                if cp.continues_into_next:  # Σ k of the last local sequence: its summary against a value of ones
                    s0 = cp.last_seq_start
                    ones = torch.ones(B, T - s0, H, 1, dtype=k.dtype, device=k.device)
                    sums, _ = _segment_states(k[:, s0:], ones, None)
                    send[:n].view(B, H, K).copy_(sums[..., 0])
            except Exception as exc:  # noqa: BLE001 - raised after the all-gather, on every rank
                error = exc
                _write_status(send[n:], error)
        gathered = _gather_and_agree(send, n, cp, "chunk_linear_attn (normalize)", error)
        rows = cp.num_local_seqs if varlen else B
        z_init = torch.zeros(rows, 1, H, K, dtype=dtype, device=q.device)
        zero_decay = torch.zeros(P, B * H, K, dtype=dtype, device=q.device)
        begin, end = cp.fold_forward
        if begin < end:
            with _phase("fold"):
                _fold(gathered[:, :n].view(P, B * H, K, 1), zero_decay, begin, end, False,
                      _first_rows(z_init.view(rows, H, K, 1), varlen))
        cu, cu_host = cp.local_op_cu_seqlens(q)
        with _phase("local"):
            o, z = _linear_attn_normalize(o_raw, q, k, z_init, cu, cu_host, scale, False)
        fctx.save_for_backward(o_raw, q, k, z_init)
        fctx.zero_decay, fctx.scale, fctx.cp, fctx.varlen = zero_decay, scale, cp, varlen
        fctx.set_materialize_grads(False)
        return o, z

    @staticmethod
    def backward(fctx, do, dz):
        from .ops.gla import _linear_attn_normalize_backward
        o_raw, q, k, z_init = fctx.saved_tensors
        cp, varlen = fctx.cp, fctx.varlen
        B, T, H, K = q.shape
        P, n = cp.world_size, B * H * K
        cu, cu_host = cp.local_op_cu_seqlens(q)
        # The local backward first: its dz_init of the first local sequence is what this rank sends (the
        # gradient reaching z from its own outputs and its z_state's gradient, for a zero gradient from later
        # ranks); what the later ranks send is added to dk below.
        send = torch.zeros(n + _STATUS, dtype=z_init.dtype, device=q.device)
        error = None
        with _phase("local"):
            try:
                if do is None:
                    do = torch.zeros(o_raw.shape, dtype=q.dtype, device=q.device)
                d_o_raw, dq, dk, dz_init = _linear_attn_normalize_backward(o_raw, q, k, z_init, cu, cu_host, do, dz,
                                                                           fctx.scale, False)
                if cp.continues_from_prev:
                    send[:n].view(B, H, K).copy_((dz_init[:1] if varlen else dz_init)[:, 0])
            except Exception as exc:  # noqa: BLE001 - raised after the all-gather, on every rank
                error = exc
                _write_status(send[n:], error)
        gathered = _gather_and_agree(send, n, cp, "chunk_linear_attn (normalize, backward)", error)
        begin, end = cp.fold_backward
        if begin < end:
            with _phase("fold"):
                d_end = torch.zeros(B * H, K, 1, dtype=z_init.dtype, device=q.device)
                _fold(gathered[:, :n].view(P, B * H, K, 1), fctx.zero_decay, begin, end, True, d_end)
                # z at the local end is z_init + Σ k of the last local sequence: each of its keys gets d_end.
                dk[:, cp.last_seq_start:] += d_end.view(B, 1, H, K).to(dk.dtype)
        return d_o_raw, dq, dk, None, None


def cp_chunk(op_name, q, k, v, g, scale, initial_state, output_final_state, cu_seqlens, cu_seqlens_host, cp, *,
             state_v_first=False, g_gamma=None, normalize=False):
    """The CP path of chunk_gla / chunk_simple_gla / chunk_linear_attn. The argument checks run inside the
    Function, before its all-gather, so that a rank's error is raised on every rank (agree_on_errors)."""
    if not isinstance(cp, CPContext):
        raise TypeError(f"flashgla: cp_context: expected a CPContext from build_cp_context, got {type(cp).__name__}")
    o, ht = _ChunkGlaCP.apply(q, k, v, g, g_gamma, scale, cp, bool(output_final_state), bool(state_v_first), op_name,
                              (initial_state, cu_seqlens, cu_seqlens_host), bool(normalize))
    return o, ht if output_final_state else None


# ---- the layer pieces: convolution halo, K/V all-gather, the loss over the group ----------------------

def check_cp_context(ctx, hidden_states: Tensor, what: str) -> None:
    """Layer-level checks of the input against a CP context (the op checks the rest)."""
    for name in ("group", "rank", "world_size", "local_tokens", "token_offset", "first_seq_offset", "cu_seqlens"):
        if not hasattr(ctx, name):
            raise TypeError(f"flashgla: cp_context: expected a context from flashgla.distributed.build_cp_context, "
                            f"got {type(ctx).__name__}")
    if hidden_states.shape[1] != ctx.local_tokens:
        raise ValueError(f"flashgla: {what}: with cp_context each rank passes its {ctx.local_tokens} tokens "
                         f"(T = {ctx.total_tokens} over {ctx.world_size} ranks), got T = {hidden_states.shape[1]}")
    if hidden_states.shape[0] > 1 and ctx.num_seqs != 1:
        raise ValueError(f"flashgla: {what}: a batch of B = {hidden_states.shape[0]} rows needs a context of one "
                         f"sequence per row (build_cp_context([0, T])), got {ctx.num_seqs} sequences: pack them "
                         "into B = 1")


def _comm_device(group, like: Tensor) -> torch.device:
    """gloo takes CPU tensors; NCCL the tensor's own CUDA device."""
    backend = str(dist.get_backend(group)).lower()
    return like.device if "nccl" in backend else torch.device("cpu")


def _all_gather_stacked(tensor: Tensor, group, world: int) -> Tensor:
    """[P, *tensor.shape]: every rank's tensor (one all-gather, any backend)."""
    device = _comm_device(group, tensor)
    local = tensor.contiguous().to(device)
    out = torch.empty((world, *local.shape), dtype=local.dtype, device=device)
    _all_gather_single(out.view(-1, *local.shape[1:]) if local.dim() > 0 else out, local, group=group)
    return out.to(tensor.device)


def _halo_rows(ctx, width: int) -> int:
    """How many of the W-1 rows before this rank's first token belong to its first local sequence."""
    if not ctx.continues_from_prev:
        return 0
    return min(width - 1, ctx.first_seq_offset)


class _ExchangeHalo(torch.autograd.Function):
    """halo [B, W-1, C] = the last W-1 rows of the previous rank's x (rows of another sequence zeroed);
    backward: each rank receives the next rank's halo gradient and adds it to its last W-1 rows."""

    @staticmethod
    def forward(fctx, x: Tensor, ctx, width: int):
        rows = width - 1
        every = _all_gather_stacked(x[:, -rows:], ctx.group, ctx.world_size)  # [P, B, W-1, C]
        halo = every[ctx.rank - 1].clone() if ctx.rank > 0 else torch.zeros_like(x[:, -rows:])
        keep = _halo_rows(ctx, width)
        halo[:, :rows - keep] = 0
        fctx.ctx, fctx.rows, fctx.keep, fctx.seq_len = ctx, rows, keep, x.shape[1]
        return halo

    @staticmethod
    def backward(fctx, grad_halo: Tensor):
        ctx, rows, keep = fctx.ctx, fctx.rows, fctx.keep
        grad_halo = grad_halo.clone()
        grad_halo[:, :rows - keep] = 0  # those rows were zeros, not the neighbour's
        every = _all_gather_stacked(grad_halo, ctx.group, ctx.world_size)  # [P, B, W-1, C]
        grad_x = grad_halo.new_zeros((grad_halo.shape[0], fctx.seq_len, grad_halo.shape[2]))
        if ctx.rank + 1 < ctx.world_size:
            grad_x[:, -rows:] = every[ctx.rank + 1]
        return grad_x, None, None


def exchange_halo(x: Tensor, ctx, width: int) -> Tensor:
    """The W-1 rows preceding this rank's first token, [B, W-1, C] (zeros where they belong to another
    sequence or before the start); differentiable, the gradient goes back to the previous rank."""
    if width < 2:
        return x[:, :0]
    if x.shape[1] < width - 1:
        raise ValueError(f"flashgla: cp_context: a short convolution of width {width} needs {width - 1} rows of "
                         f"the previous rank, but each rank holds only {x.shape[1]} tokens "
                         f"({ctx.total_tokens} over {ctx.world_size} ranks)")
    return _ExchangeHalo.apply(x, ctx, int(width))


def conv_with_halo(conv, x: Tensor, halo: Tensor, cu_seqlens: Optional[Tensor]) -> Tensor:
    """A ShortConvolution over the local rows with the halo in front of the first local sequence.

    The halo extends the first local sequence (cu_seqlens shifted by W-1 after its start), so the
    module's own within-sequence logic applies; its zero rows act as the zero padding at a start."""
    rows = halo.shape[1]
    if rows == 0:
        return conv(x, None, cu_seqlens, False)[0]
    extended = torch.cat([halo.to(x.dtype), x], dim=1)
    if cu_seqlens is not None:
        cu_seqlens = torch.cat([cu_seqlens[:1], cu_seqlens[1:] + rows])
    return conv(extended, None, cu_seqlens, False)[0][:, rows:]


# ---- softmax attention ----------------------------------------------------------------------------------

def _reduce_to_ranks(grad_full: Tensor, ctx, local: int) -> Tensor:
    """Sum of every rank's gradient for this rank's rows of a gathered [B, T, ...] tensor."""
    group, world, rank = ctx.group, ctx.world_size, ctx.rank
    device = _comm_device(group, grad_full)
    pieces = grad_full.to(device).view(grad_full.shape[0], world, local, *grad_full.shape[2:])
    pieces = pieces.transpose(0, 1).contiguous()  # [P, B, local, ...]: rank j's rows at j
    if "nccl" in str(dist.get_backend(group)).lower():
        out = torch.empty_like(pieces[0])
        dist.reduce_scatter_tensor(out, pieces, group=group)
    else:  # gloo has no reduce-scatter: all-reduce, then keep this rank's part
        dist.all_reduce(pieces, group=group)
        out = pieces[rank]
    return out.to(grad_full.device)


class _GatherKeysValues(torch.autograd.Function):
    """[B, T_local, H, D] x 2 -> the whole group's [B, T, H, D] x 2; backward: the gradients summed
    over the ranks onto each rank's own rows (a reduce-scatter)."""

    @staticmethod
    def forward(fctx, k: Tensor, v: Tensor, ctx):
        world = ctx.world_size
        both = torch.cat([k.flatten(2), v.flatten(2)], dim=-1)  # one collective for K and V
        every = _all_gather_stacked(both, ctx.group, world)      # [P, B, T_local, C]
        full = every.transpose(0, 1).reshape(k.shape[0], world * k.shape[1], -1)
        kw = k.shape[2] * k.shape[3]
        fctx.ctx, fctx.shapes, fctx.kw = ctx, (k.shape, v.shape), kw
        k_full = full[..., :kw].reshape(k.shape[0], -1, *k.shape[2:])
        v_full = full[..., kw:].reshape(v.shape[0], -1, *v.shape[2:])
        return k_full, v_full

    @staticmethod
    def backward(fctx, dk_full: Tensor, dv_full: Tensor):
        (k_shape, v_shape), ctx = fctx.shapes, fctx.ctx
        both = torch.cat([dk_full.flatten(2), dv_full.flatten(2)], dim=-1)
        local = _reduce_to_ranks(both, ctx, k_shape[1])
        return local[..., :fctx.kw].reshape(k_shape), local[..., fctx.kw:].reshape(v_shape), None


def gather_keys_values(k: Tensor, v: Tensor, ctx) -> Tuple[Tensor, Tensor]:
    """All ranks' keys and values, [B, T, Hkv, D] (gradients summed back onto each rank's own)."""
    return _GatherKeysValues.apply(k, v, ctx)


def attention_layout(ctx, batch: int, device) -> Tuple[int, int, Optional[Tensor], Optional[Tensor]]:
    """(key_begin, key_end, cu_seqlens_q, cu_seqlens_k) of this rank's attention: its local queries
    attend over gathered keys [key_begin, key_end) — from the start of its first local sequence to its
    own end — with bottom-right causal alignment per sequence. The boundaries are None for a
    fixed-length batch (B rows of one sequence each)."""
    key_end = ctx.token_offset + ctx.local_tokens
    key_begin = ctx.token_offset - ctx.first_seq_offset
    if batch > 1 or ctx.num_local_seqs == 1:
        return key_begin, key_end, None, None
    cu_q = ctx.local_cu_seqlens(device)
    cu_k = torch.cat([cu_q[:1], cu_q[1:] + ctx.first_seq_offset])
    return key_begin, key_end, cu_q, cu_k


# ---- the loss ---------------------------------------------------------------------------------------------

def cp_mean_loss(loss_sum: Tensor, count: Tensor, group) -> Tensor:
    """The mean loss over every valid token of the CP group, on every rank; its gradient on a rank is
    that of the rank's own tokens (loss_sum / global count), so the ranks' gradients sum to the
    gradient of the group's loss. One all-reduce of two numbers."""
    device = _comm_device(group, loss_sum)
    totals = torch.stack([loss_sum.detach().to(torch.float64), count.detach().to(torch.float64)]).to(device)
    dist.all_reduce(totals, group=group)
    totals = totals.to(loss_sum.device)
    others = (totals[0] - loss_sum.detach().to(torch.float64)).to(loss_sum.dtype)
    return (loss_sum + others) / totals[1].to(loss_sum.dtype)


# ---- data layout helpers ----------------------------------------------------------------------------------

def next_token_targets(labels: Tensor, ctx: CPContext, ignore_index: int = -100) -> Tensor:
    """The targets of a rank's positions from its slice [B, T/P] of labels aligned with the input ids
    (labels = input_ids, as without CP): target[:, t] = labels[:, t + 1] within a sequence, the next
    rank's first label at the rank's last position when its sequence goes on there, ignore_index at
    each sequence's last token. Collective: one all-gather of [B] labels over ctx.group, so every
    rank of the group must call it."""
    if labels.dim() != 2 or labels.shape[1] != ctx.local_tokens:
        raise ValueError(f"flashgla: labels: expected this rank's slice [B, {ctx.local_tokens}] of labels aligned "
                         f"with the input ids, got shape {list(labels.shape)}")
    firsts = _all_gather_stacked(labels[:, 0], ctx.group, ctx.world_size)  # [P, B]
    targets = torch.full_like(labels, ignore_index)
    targets[:, :-1] = labels[:, 1:]
    if ctx.continues_into_next:
        targets[:, -1] = firsts[ctx.rank + 1]
    bounds = ctx.cu_seqlens_cpu.long()
    ends = bounds[1:][bounds[1:] > bounds[:-1]] - 1  # last token of every non-empty local sequence
    if ctx.continues_into_next:
        ends = ends[ends != ctx.local_tokens - 1]
    targets[:, ends.to(labels.device)] = ignore_index
    return targets


def local_slice(tensor: Tensor, ctx, dim: int = 1) -> Tensor:
    """This rank's part [token_offset, token_offset + local_tokens) of a whole-batch tensor along `dim`."""
    return tensor.narrow(dim, ctx.token_offset, ctx.local_tokens)
