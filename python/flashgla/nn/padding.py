"""Padding masks <-> packed (variable-length) batches.

A padded batch [B, T, ...] with a mask [B, T] (1 or True for tokens, 0 for padding) becomes one
packed sequence [1, total, ...] with boundaries cu_seqlens [B+1], the layout every flashgla op takes
for variable-length input; outputs are scattered back with zeros at the padding.
"""

from typing import NamedTuple

import torch
from torch import Tensor


class Packing(NamedTuple):
    """Where the tokens of a padded batch [B, T] lie in the packed sequence (made by packing())."""

    indices: Tensor     # [total] flat positions (b * T + t) of the tokens, in order
    cu_seqlens: Tensor  # [B + 1] int32 boundaries of the packed sequences
    batch: int
    seq_len: int


def check_mask(attention_mask: Tensor, batch: int, seq_len: int) -> None:
    if attention_mask.dim() != 2 or tuple(attention_mask.shape) != (batch, seq_len):
        raise ValueError(f"attention_mask: expected shape [B, T] = [{batch}, {seq_len}], "
                         f"got {list(attention_mask.shape)}")


def has_padding(attention_mask) -> bool:
    return attention_mask is not None and not bool(attention_mask.bool().all())


def packing(attention_mask: Tensor) -> Packing:
    """Where the tokens of a padded batch go when packed; the tokens of a row keep their order."""
    mask = attention_mask.bool()
    lengths = mask.sum(dim=1, dtype=torch.int32)
    cu_seqlens = torch.zeros(mask.shape[0] + 1, dtype=torch.int32, device=mask.device)
    cu_seqlens[1:] = torch.cumsum(lengths, 0)
    indices = torch.nonzero(mask.flatten(), as_tuple=False).flatten()
    return Packing(indices, cu_seqlens, mask.shape[0], mask.shape[1])


def pack(x: Tensor, p: Packing) -> Tensor:
    """[B, T, ...] -> [1, total, ...]."""
    return x.flatten(0, 1).index_select(0, p.indices).unsqueeze(0)


def unpack(x: Tensor, p: Packing) -> Tensor:
    """[1, total, ...] -> [B, T, ...] with zeros at the padding (differentiable)."""
    out = x.new_zeros((p.batch * p.seq_len, *x.shape[2:]))
    out = out.index_copy(0, p.indices, x.squeeze(0))
    return out.view(p.batch, p.seq_len, *x.shape[2:])


def sequence_ids(cu_seqlens: Tensor, total: int) -> Tensor:
    """[total] the sequence each packed token belongs to."""
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    return torch.repeat_interleave(torch.arange(len(lengths), device=cu_seqlens.device), lengths, output_size=total)


def positions_in_sequence(cu_seqlens: Tensor, total: int) -> Tensor:
    """[total] index of each packed token within its own sequence."""
    starts = cu_seqlens[:-1].long()
    return torch.arange(total, device=cu_seqlens.device) - starts[sequence_ids(cu_seqlens, total)]


def forward_packed(forward, hidden_states: Tensor, hidden_size: int, attention_mask, cu_seqlens, state, use_cache):
    """The shared front of the layers' forward: checks hidden_states, the mask and cu_seqlens, then calls
    forward(x, cu_seqlens, state, use_cache), packing a padded batch into varlen form and back."""
    if hidden_states.dim() != 3 or hidden_states.shape[-1] != hidden_size:
        raise ValueError(f"hidden_states: expected [B, T, {hidden_size}], got {list(hidden_states.shape)}")
    if attention_mask is not None:
        if cu_seqlens is not None:
            raise ValueError("give either attention_mask or cu_seqlens, not both")
        check_mask(attention_mask, hidden_states.shape[0], hidden_states.shape[1])
    if cu_seqlens is not None and hidden_states.shape[0] != 1:
        raise ValueError(f"cu_seqlens packs all sequences into B == 1, got B = {hidden_states.shape[0]}")
    if has_padding(attention_mask):
        p = packing(attention_mask)
        out, new_state = forward(pack(hidden_states, p), p.cu_seqlens, state, use_cache)
        return unpack(out, p), new_state
    return forward(hidden_states, cu_seqlens, state, use_cache)
