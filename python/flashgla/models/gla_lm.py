"""A GLA causal language model: embeddings, blocks of RMSNorm -> GLA -> RMSNorm -> SwiGLU MLP with
residual connections, a final RMSNorm and an LM head; optional softmax-attention blocks (hybrid).

Generation prefills the prompt with the chunked GLA op (keeping each layer's final state) and then
decodes one token per step with flashgla's decode kernel; attention blocks keep a KV cache.
"""

import os
from dataclasses import dataclass
from typing import List, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..nn.attention import Attention, KVCache
from ..nn.gla import GatedLinearAttention, GLAState
from ..nn.loss import chunked_lm_cross_entropy
from ..nn.norm import RMSNorm
from ..nn.padding import check_mask, has_padding, pack, packing, unpack
from .config import GLAConfig

__all__ = ["GLAForCausalLM", "GLABlock", "SwiGLU", "Cache", "CausalLMOutput"]

CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.pt"


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class GLABlock(nn.Module):
    def __init__(self, config: GLAConfig, layer_idx: int):
        super().__init__()
        self.attn_norm = RMSNorm(config.hidden_size, config.norm_eps)
        if layer_idx in config.attn_layers:
            heads = config.attn_num_heads or config.num_heads
            self.attn = Attention(config.hidden_size, heads, config.attn_num_kv_heads or heads, config.rope_theta,
                                  config.attn_backend, layer_idx)
        else:
            self.attn = GatedLinearAttention(
                config.hidden_size, config.num_heads, config.num_kv_heads, config.expand_k, config.expand_v,
                config.gate_low_rank_dim, config.gate_logit_normalizer, config.clamp_min, config.use_output_gate,
                config.gate_fn, config.norm_eps, config.use_short_conv, config.conv_size, config.mode, layer_idx)
        self.mlp_norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size)

    def forward(self, x: Tensor, cu_seqlens: Optional[Tensor], state, use_cache: bool, cp_context=None):
        h, state = self.attn(self.attn_norm(x), cu_seqlens=cu_seqlens, state=state, use_cache=use_cache,
                             cp_context=cp_context)
        x = x + h
        return x + self.mlp(self.mlp_norm(x)), state


class Cache:
    """Per-layer generation state: a GLAState for GLA blocks, a KVCache for attention blocks."""

    def __init__(self, num_layers: int):
        self.layers: List[Union[GLAState, KVCache, None]] = [None] * num_layers
        self.seen_tokens = 0

    def __len__(self) -> int:
        return self.seen_tokens


@dataclass
class CausalLMOutput:
    logits: Optional[Tensor]        # [B, T, vocab_size] (zeros at padding); None with model.loss_chunk_size
    loss: Optional[Tensor] = None   # mean next-token cross-entropy, when labels are given
    cache: Optional[Cache] = None   # with use_cache


class GLAForCausalLM(nn.Module):
    def __init__(self, config: GLAConfig):
        super().__init__()
        self.config = config
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(GLABlock(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.apply(self._init_weights)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embeddings.weight
        # Tokens per chunk of the LM head + cross-entropy when labels are given (None: one piece).
        # Chunked, the logits are never materialised and the output's logits are None.
        self.loss_chunk_size: Optional[int] = None

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=self.config.initializer_range)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        count = sum(p.numel() for p in self.parameters())
        return count - self.embeddings.weight.numel() if exclude_embeddings else count

    def forward(self, input_ids: Tensor, attention_mask: Optional[Tensor] = None,
                cu_seqlens: Optional[Tensor] = None, labels: Optional[Tensor] = None,
                cache: Optional[Cache] = None, use_cache: bool = False, cp_context=None) -> CausalLMOutput:
        """input_ids [B, T]; attention_mask [B, T] (1: token, 0: padding) or cu_seqlens [N+1] with B == 1;
        labels [B, T] (the loss predicts labels[:, t+1] from position t; -100 and padding are ignored);
        cache: the previous call's, continued (and updated) by this one.

        cp_context (context parallelism, flashgla.distributed.build_cp_context): input_ids is this
        rank's slice [1, T/P] of the packed batch (or [B, T/P] with a context of [0, T]); labels are
        the targets of these positions, shifted over the whole batch *before* the split (-100 at
        each sequence's last token); the loss is the mean over the valid tokens of all ranks."""
        if cp_context is not None:
            return self._forward_cp(input_ids, attention_mask, cu_seqlens, labels, cache, use_cache, cp_context)
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids: expected [B, T], got shape {list(input_ids.shape)}")
        batch, seq_len = input_ids.shape
        if attention_mask is not None:
            if cu_seqlens is not None:
                raise ValueError("give either attention_mask or cu_seqlens, not both")
            check_mask(attention_mask, batch, seq_len)
        if cu_seqlens is not None and batch != 1:
            raise ValueError(f"cu_seqlens packs all sequences into B == 1, got B = {batch}")
        if use_cache and cache is None:
            cache = Cache(len(self.layers))

        x = self.embeddings(input_ids)
        p = packing(attention_mask) if has_padding(attention_mask) else None
        if p is not None:  # pack once for all layers
            x, cu_seqlens = pack(x, p), p.cu_seqlens
        for i, layer in enumerate(self.layers):
            state = cache.layers[i] if cache is not None else None
            x, state = layer(x, cu_seqlens, state, use_cache)
            if use_cache:
                cache.layers[i] = state
        hidden = self.norm(x)
        chunked = labels is not None and self.loss_chunk_size is not None
        logits = None if chunked else self.lm_head(hidden)
        if p is not None:
            if chunked:
                hidden = unpack(hidden, p)
            else:
                logits = unpack(logits, p)
        if use_cache:
            cache.seen_tokens += seq_len

        loss = None
        if labels is not None:
            if tuple(labels.shape) != (batch, seq_len):
                raise ValueError(f"labels: expected shape [B, T] = [{batch}, {seq_len}], got {list(labels.shape)}")
            targets = labels[:, 1:]
            if attention_mask is not None:  # both the predicting and the predicted token must be real
                real = attention_mask.bool()
                targets = targets.masked_fill(~(real[:, 1:] & real[:, :-1]), -100)
            if cu_seqlens is not None and p is None:  # no prediction across a sequence boundary
                starts = torch.zeros(seq_len + 1, dtype=torch.bool, device=labels.device)
                starts[cu_seqlens[1:-1].long()] = True
                targets = targets.masked_fill(starts[1:seq_len].unsqueeze(0), -100)
            if chunked:
                loss_sum, count = chunked_lm_cross_entropy(hidden[:, :-1].reshape(-1, hidden.shape[-1]),
                                                           self.lm_head.weight, targets.reshape(-1),
                                                           self.loss_chunk_size)
                loss = loss_sum / count  # the mean over counted tokens, as F.cross_entropy's
            else:
                scores = logits[:, :-1] if logits.dtype in (torch.float32, torch.float64) else logits[:, :-1].float()
                loss = F.cross_entropy(scores.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)
        return CausalLMOutput(logits, loss, cache if use_cache else None)

    def _forward_cp(self, input_ids, attention_mask, cu_seqlens, labels, cache, use_cache, cp_context):
        from ..parallel.layers import cp_mean_loss

        if input_ids.dim() != 2:
            raise ValueError(f"input_ids: expected [B, T], got shape {list(input_ids.shape)}")
        if attention_mask is not None or cu_seqlens is not None or cache is not None or use_cache:
            raise ValueError("flashgla: cp_context: the model takes the boundaries from the context: pass no "
                             "attention_mask, cu_seqlens or cache, and use_cache=False")
        if labels is not None and labels.shape != input_ids.shape:
            raise ValueError(f"labels: expected the shape of input_ids {list(input_ids.shape)} (targets shifted "
                             f"before the split), got {list(labels.shape)}")
        x = self.embeddings(input_ids)
        for layer in self.layers:
            x, _ = layer(x, None, None, False, cp_context)
        hidden = self.norm(x)
        chunked = labels is not None and self.loss_chunk_size is not None
        logits = None if chunked else self.lm_head(hidden)
        loss = None
        if labels is not None:
            targets = labels.reshape(-1)
            if chunked:
                loss_sum, count = chunked_lm_cross_entropy(hidden.reshape(-1, hidden.shape[-1]), self.lm_head.weight,
                                                           targets, self.loss_chunk_size)
            else:
                scores = logits if logits.dtype in (torch.float32, torch.float64) else logits.float()
                loss_sum = F.cross_entropy(scores.reshape(-1, logits.shape[-1]), targets, ignore_index=-100,
                                           reduction="sum")
                count = (targets != -100).sum()
            loss = cp_mean_loss(loss_sum, count, cp_context.group)
        return CausalLMOutput(logits, loss, None)

    # ---- generation ------------------------------------------------------------------------------------

    @torch.no_grad()
    def generate(self, input_ids: Tensor, max_new_tokens: int, attention_mask: Optional[Tensor] = None,
                 do_sample: bool = False, temperature: float = 1.0, top_k: Optional[int] = None,
                 eos_token_id: Optional[int] = None, generator: Optional[torch.Generator] = None) -> Tensor:
        """Continues each prompt by max_new_tokens tokens: greedy, or sampled (temperature, top-k).

        input_ids [B, T]; a batch of prompts of different lengths is padded on the left, with
        attention_mask marking the tokens. Returns [B, T + max_new_tokens]; after eos_token_id a
        sequence continues with eos_token_id.
        """
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be ≥ 0, got {max_new_tokens}")
        if do_sample and not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k must be at least 1, got {top_k}")
        if max_new_tokens == 0:
            return input_ids
        if attention_mask is not None:
            check_mask(attention_mask, *input_ids.shape)
            if not bool(attention_mask[:, -1].bool().all()):
                raise ValueError("generate: pad prompts on the left (attention_mask[:, -1] must be all 1)")
        if has_padding(attention_mask) and self.config.attn_layers:
            # Attention blocks keep one KV cache per batch: generate padded prompts one at a time.
            new_tokens = [self.generate(input_ids[b:b + 1][:, attention_mask[b].bool()], max_new_tokens, None,
                                        do_sample, temperature, top_k, eos_token_id, generator)[:, -max_new_tokens:]
                          for b in range(input_ids.shape[0])]
            return torch.cat([input_ids, torch.cat(new_tokens)[:, :max_new_tokens]], dim=1)

        out = self(input_ids, attention_mask=attention_mask, use_cache=True)
        cache, logits = out.cache, out.logits[:, -1]
        tokens = [input_ids]
        finished = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        for step in range(max_new_tokens):
            next_token = self._pick(logits.float(), do_sample, temperature, top_k, generator)
            if eos_token_id is not None:
                next_token = next_token.masked_fill(finished, eos_token_id)
                finished |= next_token == eos_token_id
            tokens.append(next_token.unsqueeze(1))
            if step + 1 == max_new_tokens or (eos_token_id is not None and bool(finished.all())):
                break
            logits = self(next_token.unsqueeze(1), cache=cache, use_cache=True).logits[:, -1]
        result = torch.cat(tokens, dim=1)
        if result.shape[1] < input_ids.shape[1] + max_new_tokens:  # everyone stopped early
            result = F.pad(result, (0, input_ids.shape[1] + max_new_tokens - result.shape[1]), value=eos_token_id)
        return result

    @staticmethod
    def _pick(logits: Tensor, do_sample: bool, temperature: float, top_k: Optional[int],
              generator: Optional[torch.Generator]) -> Tensor:
        if not do_sample:
            return logits.argmax(dim=-1)
        logits = logits / temperature
        if top_k is not None and top_k < logits.shape[-1]:
            threshold = torch.topk(logits, top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < threshold, float("-inf"))
        return torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator).squeeze(1)

    # ---- save / load -------------------------------------------------------------------------------------

    def save_pretrained(self, directory: str) -> None:
        """Writes config.json and model.pt (the state dict, via torch.save) into directory."""
        os.makedirs(directory, exist_ok=True)
        self.config.to_json(os.path.join(directory, CONFIG_FILE))
        torch.save(self.state_dict(), os.path.join(directory, WEIGHTS_FILE))

    @classmethod
    def from_pretrained(cls, directory: str, map_location="cpu", dtype: Optional[torch.dtype] = None
                        ) -> "GLAForCausalLM":
        config = GLAConfig.from_json(os.path.join(directory, CONFIG_FILE))
        model = cls(config)
        state = torch.load(os.path.join(directory, WEIGHTS_FILE), map_location=map_location, weights_only=True)
        model.load_state_dict(state)
        model = model.to(map_location if isinstance(map_location, (str, torch.device)) else "cpu")
        return model.to(dtype) if dtype is not None else model
