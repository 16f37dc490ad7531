"""Causal depthwise short convolution (kernel of a few tokens) with SiLU, applied to q, k and v
before the GLA recurrence when `use_short_conv` is set, with a cache of the last inputs for
token-by-token generation and packed (variable-length) batches that never mix sequences."""

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .padding import positions_in_sequence, sequence_ids


class ShortConvolution(nn.Module):
    """y_t = silu(sum_w weight[:, w] * x_{t - (W-1) + w}) per channel, within each sequence.

    The cache holds the last W-1 inputs of each sequence, [N, W-1, C] (oldest first).
    """

    def __init__(self, channels: int, kernel_size: int):
        super().__init__()
        if kernel_size < 1:
            raise ValueError(f"conv_size must be at least 1, got {kernel_size}")
        self.channels, self.kernel_size = channels, kernel_size
        self.weight = nn.Parameter(torch.empty(channels, kernel_size))
        nn.init.uniform_(self.weight, -kernel_size ** -0.5, kernel_size ** -0.5)

    def forward(self, x: Tensor, cache: Optional[Tensor] = None, cu_seqlens: Optional[Tensor] = None,
                output_cache: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
        """x [B, T, C] (or [1, total, C] with cu_seqlens); returns y and, if asked, the new cache."""
        W = self.kernel_size
        batch, seq_len, channels = x.shape
        num_seqs = batch if cu_seqlens is None else cu_seqlens.numel() - 1
        if cache is not None and tuple(cache.shape) != (num_seqs, W - 1, channels):
            raise ValueError(f"conv cache: expected shape [{num_seqs}, {W - 1}, {channels}], got {list(cache.shape)}")
        if cu_seqlens is None:
            position = torch.arange(seq_len, device=x.device).view(1, seq_len)   # [1, T]
            sequence = torch.arange(batch, device=x.device).view(batch, 1)       # [B, 1]
        else:
            position = positions_in_sequence(cu_seqlens, seq_len).view(1, seq_len)
            sequence = sequence_ids(cu_seqlens, seq_len).view(1, seq_len)
        y = x * self.weight[:, W - 1]
        for shift in range(1, W):
            # x_{t-shift} from the same sequence, else from the cache, else 0.
            earlier = F.pad(x, (0, 0, shift, 0))[:, :seq_len]
            inside = (position >= shift).unsqueeze(-1)
            if cache is not None:
                slot = (W - 1 - shift + position).clamp(min=0, max=W - 2)  # cache index of x_{t-shift}
                from_cache = cache[sequence.expand(batch, seq_len), slot.expand(batch, seq_len)]
                earlier = torch.where(inside, earlier, from_cache.to(x.dtype))
            else:
                earlier = earlier * inside
            y = y + earlier * self.weight[:, W - 1 - shift]
        y = F.silu(y)
        return y, (self._last_inputs(x, cache, cu_seqlens) if output_cache else None)

    def _last_inputs(self, x: Tensor, cache: Optional[Tensor], cu_seqlens: Optional[Tensor]) -> Tensor:
        W = self.kernel_size
        if cu_seqlens is None:
            history = cache if cache is not None else x.new_zeros(x.shape[0], W - 1, x.shape[2])
            last = torch.cat([history.to(x.dtype), x], dim=1)[:, x.shape[1]:] if W > 1 else history
            if (x.shape[1] == 1 and cache is not None and cache.dtype == x.dtype
                    and not (torch.is_grad_enabled() and (x.requires_grad or cache.requires_grad))):
                # One decoded token: the cache is updated in place, like the GLA state, so a step captured
                # in a CUDA graph keeps reading and writing the same buffer.
                return cache.copy_(last)
            return last
        bounds = cu_seqlens.tolist()
        rows = []
        for n in range(len(bounds) - 1):
            history = cache[n] if cache is not None else x.new_zeros(W - 1, x.shape[2])
            rows.append(torch.cat([history.to(x.dtype), x[0, bounds[n]:bounds[n + 1]]], dim=0)[-(W - 1):]
                        if W > 1 else history)
        return torch.stack(rows)
