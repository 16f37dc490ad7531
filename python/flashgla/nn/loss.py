"""Cross-entropy of an LM head computed in chunks of tokens, for long contexts.

The logits of 128K tokens over a 32K vocabulary are 16 GiB in fp32: more than the whole model's
activations under checkpointing. `chunked_lm_cross_entropy` never materialises them: the forward
runs the head and the log-sum-exp one chunk of tokens at a time and keeps only the per-token
log-sum-exp; the backward recomputes each chunk's logits, turns them into the softmax gradient and
accumulates dW and dh chunk by chunk. Peak extra memory is one chunk of logits (fp32).
"""

from typing import Optional, Tuple

import torch
from torch import Tensor

__all__ = ["chunked_lm_cross_entropy"]


def _compute_dtype(hidden: Tensor, weight: Tensor) -> torch.dtype:
    """What an autocast matmul would compute in (autocast does not reach into a Function's backward)."""
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type) and hidden.dtype in (torch.float32, torch.bfloat16, torch.float16):
        return torch.get_autocast_dtype(device_type)
    return torch.promote_types(hidden.dtype, weight.dtype)


def _chunk_logits(hidden: Tensor, weight: Tensor, dtype: torch.dtype) -> Tensor:
    # The matmul runs in the compute dtype (bf16 under autocast); the softmax in fp32 or fp64.
    logits = hidden.to(dtype) @ weight.to(dtype).t()
    return logits.float() if logits.dtype in (torch.bfloat16, torch.float16) else logits


class _ChunkedLMCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor, chunk_size: int, ignore_index: int):
        dtype = _compute_dtype(hidden, weight)
        valid = targets != ignore_index
        safe_targets = targets.masked_fill(~valid, 0)
        total = None
        lse = torch.empty(hidden.shape[0], dtype=torch.float64 if dtype == torch.float64 else torch.float32,
                          device=hidden.device)
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, hidden.shape[0], chunk_size):
                end = min(start + chunk_size, hidden.shape[0])
                logits = _chunk_logits(hidden[start:end], weight, dtype)
                chunk_lse = torch.logsumexp(logits, dim=-1)
                lse[start:end] = chunk_lse
                picked = logits.gather(1, safe_targets[start:end].unsqueeze(1)).squeeze(1)
                part = ((chunk_lse - picked) * valid[start:end]).sum()
                total = part if total is None else total + part
        if total is None:
            total = lse.new_zeros(())
        ctx.save_for_backward(hidden, weight, safe_targets, valid, lse)
        ctx.chunk_size, ctx.dtype = chunk_size, dtype
        return total

    @staticmethod
    def backward(ctx, grad_total: Tensor):
        hidden, weight, targets, valid, lse = ctx.saved_tensors
        dtype = ctx.dtype
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32 if dtype != torch.float64 else dtype,
                                  device=weight.device) if need_weight else None
        w = weight.to(dtype)
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, hidden.shape[0], ctx.chunk_size):
                end = min(start + ctx.chunk_size, hidden.shape[0])
                h = hidden[start:end].to(dtype)
                logits = _chunk_logits(h, weight, dtype)
                # d(lse - logit[target]) / dlogits = softmax - onehot, for valid tokens only.
                grad_logits = torch.exp(logits - lse[start:end].unsqueeze(1))
                grad_logits[torch.arange(end - start, device=h.device), targets[start:end]] -= 1
                grad_logits *= (valid[start:end].to(grad_logits.dtype) * grad_total).unsqueeze(1)
                grad_logits = grad_logits.to(dtype)
                if need_hidden:
                    grad_hidden[start:end] = (grad_logits @ w).to(hidden.dtype)
                if need_weight:
                    grad_weight += (grad_logits.t() @ h).to(grad_weight.dtype)
        return grad_hidden, (grad_weight.to(weight.dtype) if need_weight else None), None, None, None


def chunked_lm_cross_entropy(hidden: Tensor, weight: Tensor, targets: Tensor, chunk_size: int = 8192,
                             ignore_index: int = -100) -> Tuple[Tensor, Tensor]:
    """Sum over tokens of cross_entropy(hidden @ weight.T, targets), and the number of counted tokens.

    hidden [N, D] (the final norm's output), weight [vocab, D] (the LM head), targets [N] (int64;
    ignore_index is skipped). Returns (loss_sum, count) where count is an int64 scalar tensor (no host
    sync); divide the sum by the count you want (local, or all-reduced across context-parallel ranks).
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"flashgla: hidden, weight: expected [N, D] and [vocab, D], got {list(hidden.shape)} "
                         f"and {list(weight.shape)}")
    if targets.shape != hidden.shape[:1]:
        raise ValueError(f"flashgla: targets: expected shape [{hidden.shape[0]}], got {list(targets.shape)}")
    if chunk_size < 1:
        raise ValueError(f"flashgla: chunk_size: expected at least 1, got {chunk_size}")
    total = _ChunkedLMCrossEntropy.apply(hidden, weight, targets.long(), int(chunk_size), int(ignore_index))
    return total, (targets != ignore_index).sum()
