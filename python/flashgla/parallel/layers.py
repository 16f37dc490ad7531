"""The pieces a GLA model needs under context parallelism (CP), besides the GLA op itself.

Each rank holds a contiguous slice of the packed sequence dimension (a CP context from
build_cp_context says which). Three things cross rank boundaries:

- the short convolution: rank r needs the last W-1 input rows of rank r-1 (zero where a sequence
  starts at rank r's first token), and sends their gradient back (`exchange_halo`);
- softmax attention: every query needs the keys and values of its sequence up to itself, so K and V
  are all-gathered (their gradients summed back over the ranks) and each rank attends with its
  local queries over the keys up to its own end (`gather_keys_values`);
- the loss: each rank sums its tokens' losses and divides by the all-reduced count of valid tokens
  (`cp_mean_loss`).

Every collective sits in an autograd Function that communicates on every rank, with messages of
the same shape everywhere (never empty), so a rank whose data does not need a neighbour's rows still
takes part and nobody waits on a collective another rank skipped.
"""

from typing import Optional, Tuple

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = ["exchange_halo", "conv_with_halo", "gather_keys_values", "cp_mean_loss", "attention_layout",
           "check_cp_context", "shift_labels", "local_slice"]


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


# all_gather_into_tensor is deprecated in newer torch (all_gather_single), absent from older.
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


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

def shift_labels(input_ids: Tensor, cu_seqlens: Optional[Tensor] = None, ignore_index: int = -100) -> Tensor:
    """Next-token targets of a whole batch, shifted *before* it is split over CP ranks:
    labels[:, t] = input_ids[:, t + 1], ignore_index at each sequence's last token (each row's last
    token without cu_seqlens; each packed sequence's with cu_seqlens [N+1] and B == 1)."""
    labels = torch.full_like(input_ids, ignore_index)
    labels[:, :-1] = input_ids[:, 1:]
    if cu_seqlens is not None:
        # An empty sequence's "last token" is the previous sequence's (or, at the start, index -1:
        # the batch's last token), which is ignored anyway: no filtering, no host sync.
        labels[:, cu_seqlens[1:].long() - 1] = ignore_index
    return labels


def local_slice(tensor: Tensor, ctx, dim: int = 1) -> Tensor:
    """This rank's part [token_offset, token_offset + local_tokens) of a whole-batch tensor along `dim`."""
    return tensor.narrow(dim, ctx.token_offset, ctx.local_tokens)
