"""A GLA causal language model: embeddings, blocks of RMSNorm -> GLA -> RMSNorm -> SwiGLU MLP with
residual connections, a final RMSNorm and an LM head; optional softmax-attention blocks (hybrid).

Generation prefills the prompt with the chunked GLA op (keeping each layer's final state) and then
decodes one token per step with flashgla's decode kernel; attention blocks keep a KV cache.
"""

import numbers
import os
import sys
import time
import warnings
from dataclasses import dataclass, fields
from typing import List, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..nn.attention import Attention, KVCache
from ..nn.gla import GatedLinearAttention, GLAState
from ..nn.loss import chunked_lm_cross_entropy
from ..nn.norm import RMSNorm
from ..nn.padding import check_mask, has_padding, pack, packing, unpack
from .checkpoint import (FLA_MODEL_TYPE, HF_MODEL_TYPE, config_from_fla, load_torch_file, load_weights,
                         state_dict_from_fla)
from .config import GLAConfig, read_json

__all__ = ["GLAForCausalLM", "GLABlock", "SwiGLU", "Cache", "CausalLMOutput"]

CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.pt"


def check_token_ids(input_ids: Tensor, vocab_size: int) -> None:
    """ValueError naming the first token id outside [0, vocab_size), instead of an IndexError from the
    embedding (or a device-side assert on a GPU). Reading the ids back costs a device sync, so the forward
    checks CPU tensors only; generate checks its prompt on any device, once."""
    if input_ids.numel() == 0 or torch.compiler.is_compiling():
        return
    if input_ids.is_floating_point() or input_ids.is_complex() or input_ids.dtype == torch.bool:
        raise TypeError(f"flashgla: input_ids: expected integer token ids, got dtype {input_ids.dtype}")
    bad = (input_ids < 0) | (input_ids >= vocab_size)
    if bool(bad.any()):
        where = bad.nonzero()[0].tolist()
        raise ValueError(f"flashgla: input_ids: token id {int(input_ids[tuple(where)])} at position {where} is outside "
                         f"the vocabulary: ids must lie in [0, {vocab_size}) (config.vocab_size = {vocab_size})")


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
    """One block of the model: x + mixer(RMSNorm(x)), then x + SwiGLU(RMSNorm(x)); the mixer is
    GatedLinearAttention, or softmax Attention when layer_idx is in config.attn_layers (a hybrid)."""

    def __init__(self, config: GLAConfig, layer_idx: int):
        super().__init__()
        self.attn_norm = RMSNorm(config.hidden_size, config.norm_eps)
        if layer_idx in config.attn_layers:
            heads = config.attn_num_heads or config.num_heads
            self.attn = Attention(config.hidden_size, heads, config.attn_num_kv_heads or heads, config.rope_theta,
                                  config.attn_backend, layer_idx, config.attn_deterministic)
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
    """What GLAForCausalLM.forward returns: logits, the loss when labels are given, the cache with use_cache."""

    logits: Optional[Tensor]        # [B, T, vocab_size] (zeros at padding); None with model.loss_chunk_size
    loss: Optional[Tensor] = None   # mean next-token cross-entropy, when labels are given
    cache: Optional[Cache] = None   # with use_cache


class _GraphDecoder:
    """The one-token decode step of a model on a fixed batch, as a CUDA graph.

    Every per-layer state is a fixed buffer updated in place by the step (GLA states by the decode
    kernel, short-convolution inputs by a copy, attention keys and values written at device-side
    positions, one per sequence for the flashgla backend, into caches preallocated to the final
    length), so the step has static shapes and no
    host synchronization. The first call runs the step eagerly on a side stream (warm-up: lazy
    initializations, workspace allocations), the second captures it, and every call from then on
    copies the token into the graph's input and replays it. On capture failure it stays eager.
    """

    def __init__(self, model: "GLAForCausalLM", cache: Cache, batch: int, capacity: int):
        self.model, self.cache = model, cache
        device = next(model.parameters()).device
        self.position = None
        for i, state in enumerate(cache.layers):
            if isinstance(state, KVCache):  # preallocate to the final length, filled with the prompt's keys
                if self.position is None:
                    self.position = torch.full((1,), state.length, dtype=torch.int64, device=device)
                static = KVCache.empty(batch, state.k.shape[2], state.k.shape[3], capacity, state.k.dtype, device)
                static.k[:, :state.length] = state.k[:, :state.length]
                static.v[:, :state.length] = state.v[:, :state.length]
                static.length, static.position = state.length, self.position
                # Per-sequence lengths (flashgla backend): a fixed device buffer the step advances in place.
                static.seqlens = state.lengths().clone()
                cache.layers[i] = static
        self.token = torch.zeros(batch, 1, dtype=torch.int64, device=device)
        self.graph, self.logits, self.calls = None, None, 0
        self.batch, self.capacity = batch, capacity
        self.capture = device.type == "cuda"  # elsewhere the static-shape step runs eagerly

    def release(self) -> None:
        """Back to ordinary (growing) KV caches, e.g. before decoding past the capacity."""
        for state in self.cache.layers:
            if isinstance(state, KVCache):
                state.position = None
        self.graph = self.logits = None

    def _step(self) -> Tensor:
        logits = self.model(self.token, cache=self.cache, use_cache=True).logits[:, -1]
        if self.position is not None:
            self.position.add_(1)
        return logits

    def __call__(self, token: Tensor) -> Tensor:
        seen = self.cache.seen_tokens
        self.token.copy_(token.view(-1, 1))
        if not self.capture:
            logits = self._step()
        elif self.calls == 0:  # warm-up, on a side stream as capture requires
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                logits = self._step()
            torch.cuda.current_stream().wait_stream(side)
        else:
            if self.calls == 1:
                graph = torch.cuda.CUDAGraph()
                try:
                    with torch.cuda.graph(graph):
                        self.logits = self._step()
                    self.graph = graph
                except RuntimeError as error:  # e.g. an op that cannot be captured: continue eagerly
                    warnings.warn(f"flashgla: generate: CUDA graph capture failed ({error}); decoding eagerly",
                                  RuntimeWarning, stacklevel=3)
            if self.graph is not None:
                self.graph.replay()
                logits = self.logits
            else:
                logits = self._step()
        self.calls += 1
        self.cache.seen_tokens = seen + 1  # the step's host-side bookkeeping runs only when not replayed
        for state in self.cache.layers:
            if isinstance(state, KVCache):
                state.length += 1
        return logits


class _Progress:
    """generate(progress=True)'s lines on stderr: tokens so far of the total, and the rate since the start."""

    def __init__(self, total: int, batch: int, every: int):
        self.total, self.batch, self.every, self.start = total, batch, every, time.perf_counter()

    def _line(self, tokens: int) -> None:
        seconds = time.perf_counter() - self.start
        rate = tokens / seconds if seconds > 0 else float("inf")
        print(f"generate: {tokens}/{self.total} tokens ({self.batch} sequences, {seconds:.1f} s, {rate:.1f} "
              "tokens/s per sequence)", file=sys.stderr, flush=True)

    def step(self, step: int) -> None:
        if step > 0 and step % self.every == 0:
            self._line(step)

    def done(self, tokens: int) -> None:
        self._line(tokens)


class GLAForCausalLM(nn.Module):
    """A GLA Transformer language model: token embeddings, config.num_hidden_layers GLABlocks, a final
    RMSNorm and the LM head (tied to the embeddings with config.tie_word_embeddings).

    forward(input_ids, labels=...) gives logits and the next-token loss (padded, packed or
    context-parallel batches); generate() continues prompts with the chunked prefill and the decode
    kernel; save_pretrained / from_pretrained write and read config.json + model.pt (and read
    flash-linear-attention checkpoints)."""

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
                cache: Optional[Cache] = None, use_cache: bool = False, logits_to_keep: int = 0,
                cp_context=None) -> CausalLMOutput:
        """input_ids [B, T]; attention_mask [B, T] (1: token, 0: padding) or cu_seqlens [N+1] with B == 1;
        labels [B, T] (the loss predicts labels[:, t+1] from position t, never across a sequence boundary:
        labels=input_ids trains next-token prediction; -100 and padding are ignored);
        cache: the previous call's, continued (and updated) by this one; logits_to_keep n > 0: only the
        logits of the last n positions (generation needs the last one; ignored with labels).

        cp_context (context parallelism, flashgla.distributed.build_cp_context): input_ids is this
        rank's slice [1, T/P] of the packed batch (or [B, T/P] with a context of [0, T]) and labels the
        same slice of the labels, by the same rule as without CP (the shift across the ranks' edges is
        done inside, flashgla.distributed.next_token_targets); the loss is the mean over the valid
        tokens of all ranks, equal to the one process's."""
        if cp_context is not None:
            return self._forward_cp(input_ids, attention_mask, cu_seqlens, labels, cache, use_cache, cp_context)
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids: expected [B, T], got shape {list(input_ids.shape)}")
        batch, seq_len = input_ids.shape
        if input_ids.device.type == "cpu":
            check_token_ids(input_ids, self.config.vocab_size)
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
        if logits_to_keep > 0 and labels is None and p is None and cu_seqlens is None:
            x = x[:, -logits_to_keep:]
        hidden = self.norm(x)
        chunked = labels is not None and self.loss_chunk_size is not None
        logits = None if chunked else self.lm_head(hidden)
        if p is not None:
            if chunked:
                hidden = unpack(hidden, p)
            else:
                logits = unpack(logits, p)
                if logits_to_keep > 0 and labels is None:
                    logits = logits[:, -logits_to_keep:]
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
        from ..distributed import cp_mean_loss, next_token_targets

        if input_ids.dim() != 2:
            raise ValueError(f"input_ids: expected [B, T], got shape {list(input_ids.shape)}")
        if attention_mask is not None or cu_seqlens is not None or cache is not None or use_cache:
            raise ValueError("flashgla: cp_context: the model takes the boundaries from the context: pass no "
                             "attention_mask, cu_seqlens or cache, and use_cache=False")
        if labels is not None and labels.shape != input_ids.shape:
            raise ValueError(f"labels: expected the shape of input_ids {list(input_ids.shape)} (the rank's slice "
                             f"of labels aligned with the input ids), got {list(labels.shape)}")
        x = self.embeddings(input_ids)
        for layer in self.layers:
            x, _ = layer(x, None, None, False, cp_context)
        hidden = self.norm(x)
        chunked = labels is not None and self.loss_chunk_size is not None
        logits = None if chunked else self.lm_head(hidden)
        loss = None
        if labels is not None:
            targets = next_token_targets(labels, cp_context).reshape(-1)
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
                 eos_token_id: Optional[int] = None, generator: Optional[torch.Generator] = None,
                 cuda_graph: Optional[bool] = None, progress: bool = False) -> Tensor:
        """Continues each prompt by max_new_tokens tokens: greedy, or sampled (temperature, top-k).

        input_ids [B, T]; a batch of prompts of different lengths is padded on the left, with
        attention_mask marking the tokens. Returns [B, T + max_new_tokens]; after eos_token_id a
        sequence continues with eos_token_id.

        cuda_graph: on CUDA the one-token decode step (all layers and the head) is captured in a CUDA
        graph after one eager warm-up step and replayed (None: automatically on CUDA when at least
        GRAPH_MIN_TOKENS tokens are generated; False: always eager; True: always; on the CPU, True runs
        the same static-shape step eagerly).

        progress: print a line to stderr every PROGRESS_EVERY tokens (and at the end): tokens so far and
        tokens per second.
        """
        vocab = self.config.vocab_size
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, numbers.Integral):
            raise TypeError(f"flashgla: max_new_tokens: expected an int >= 0, got {max_new_tokens!r} "
                            f"({type(max_new_tokens).__name__})")
        max_new_tokens = int(max_new_tokens)
        if max_new_tokens < 0:
            raise ValueError(f"flashgla: max_new_tokens: expected an int >= 0, got {max_new_tokens}")
        if do_sample and not temperature > 0:
            raise ValueError(f"flashgla: temperature: expected a number > 0, got {temperature}")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 1):
            raise ValueError(f"flashgla: top_k: expected an int >= 1 (or None), got {top_k!r}")
        if eos_token_id is not None:
            if isinstance(eos_token_id, bool) or not isinstance(eos_token_id, numbers.Integral):
                raise TypeError(f"flashgla: eos_token_id: expected one token id (an int) or None, got "
                                f"{eos_token_id!r} ({type(eos_token_id).__name__})")
            if not 0 <= eos_token_id < vocab:
                raise ValueError(f"flashgla: eos_token_id: {eos_token_id} is outside the vocabulary: ids must lie "
                                 f"in [0, {vocab}) (config.vocab_size = {vocab})")
            eos_token_id = int(eos_token_id)
        if input_ids.dim() != 2 or input_ids.shape[1] == 0:
            raise ValueError(f"flashgla: input_ids: generate needs a prompt of at least one token per sequence "
                             f"[B, T] with T >= 1, got shape {list(input_ids.shape)}")
        check_token_ids(input_ids, self.config.vocab_size)
        if max_new_tokens == 0:
            return input_ids
        if attention_mask is not None:
            check_mask(attention_mask, *input_ids.shape)
            if not bool(attention_mask[:, -1].bool().all()):
                raise ValueError("generate: pad prompts on the left (attention_mask[:, -1] must be all 1)")
        if has_padding(attention_mask) and self.config.attn_layers and self.config.attn_backend != "flashgla":
            # The sdpa baseline keeps one KV length per batch: generate padded prompts one at a time
            # (flashgla's attention keeps one length per sequence and takes them in one batch).
            new_tokens = [self.generate(input_ids[b:b + 1][:, attention_mask[b].bool()], max_new_tokens, None,
                                        do_sample, temperature, top_k, eos_token_id, generator,
                                        cuda_graph, progress)[:, -max_new_tokens:]
                          for b in range(input_ids.shape[0])]
            return torch.cat([input_ids, torch.cat(new_tokens)[:, :max_new_tokens]], dim=1)

        if cuda_graph is None:
            cuda_graph = input_ids.is_cuda and max_new_tokens >= self.GRAPH_MIN_TOKENS

        out = self(input_ids, attention_mask=attention_mask, use_cache=True, logits_to_keep=1)
        cache, logits = out.cache, out.logits[:, -1]
        if cuda_graph:
            decode = _GraphDecoder(self, cache, input_ids.shape[0], input_ids.shape[1] + max_new_tokens)
        else:
            def decode(token: Tensor) -> Tensor:
                return self(token.unsqueeze(1), cache=cache, use_cache=True).logits[:, -1]
        tokens = [input_ids]
        finished = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        report = _Progress(max_new_tokens, input_ids.shape[0], self.PROGRESS_EVERY) if progress else None
        for step in range(max_new_tokens):
            if report is not None:
                report.step(step)
            next_token = self._pick(logits.float(), do_sample, temperature, top_k, generator)
            if eos_token_id is not None:
                next_token = next_token.masked_fill(finished, eos_token_id)
                finished |= next_token == eos_token_id
            tokens.append(next_token.unsqueeze(1))
            if step + 1 == max_new_tokens or (eos_token_id is not None and bool(finished.all())):
                break
            logits = decode(next_token)
        if report is not None:
            report.done(len(tokens) - 1)
        result = torch.cat(tokens, dim=1)
        if result.shape[1] < input_ids.shape[1] + max_new_tokens:  # everyone stopped early
            result = F.pad(result, (0, input_ids.shape[1] + max_new_tokens - result.shape[1]), value=eos_token_id)
        return result

    GRAPH_MIN_TOKENS = 4  # below this many new tokens, capturing a graph costs more than it saves
    PROGRESS_EVERY = 32   # generate(progress=True): a line per this many tokens

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
        """Loads a checkpoint directory: flashgla's own (config.json + model.pt), one written by
        flashgla.models.hf (model type "flashgla_gla", safetensors), or one written by FLA's
        GLAForCausalLM (model type "gla"; safetensors or pytorch_model.bin, FLA's names and options)."""
        config_path = os.path.join(directory, CONFIG_FILE)
        if not os.path.exists(config_path):
            raise FileNotFoundError(f"flashgla: {directory}: no {CONFIG_FILE} in this directory")
        values = read_json(config_path)
        if not isinstance(values, dict):
            raise ValueError(f"flashgla: {config_path}: expected a JSON object of config fields, got "
                             f"{type(values).__name__}")
        model_type = values.get("model_type")
        if model_type == FLA_MODEL_TYPE:
            config = config_from_fla(values, config_path)
            state = state_dict_from_fla(load_weights(directory), config)
        elif model_type == HF_MODEL_TYPE:
            config = GLAConfig.from_dict({f.name: values[f.name] for f in fields(GLAConfig) if f.name in values},
                                         config_path)
            state = {k[len("model."):]: v for k, v in load_weights(directory).items() if k.startswith("model.")}
            if config.tie_word_embeddings and "lm_head.weight" not in state and "embeddings.weight" in state:
                state["lm_head.weight"] = state["embeddings.weight"]
        elif model_type is not None:
            raise ValueError(f"flashgla: {config_path}: model_type {model_type!r} is not a GLA model "
                             f"(expected {HF_MODEL_TYPE!r}, FLA's {FLA_MODEL_TYPE!r} or none)")
        else:
            config = GLAConfig.from_dict(values, config_path)
            weights_path = os.path.join(directory, WEIGHTS_FILE)
            if not os.path.exists(weights_path):
                raise FileNotFoundError(f"flashgla: {directory}: no {WEIGHTS_FILE} next to {CONFIG_FILE}")
            state = load_torch_file(weights_path)
            if not isinstance(state, dict):
                raise ValueError(f"flashgla: {weights_path}: expected a state dict (name -> tensor), got "
                                 f"{type(state).__name__}")
        model = cls(config)
        if dtype is not None:  # before loading, so weights stored in that dtype arrive unrounded
            model = model.to(dtype)
        model.load_checkpoint_state(state, directory)
        return model.to(map_location if isinstance(map_location, (str, torch.device)) else "cpu")

    def load_checkpoint_state(self, state: dict, source: str = "checkpoint") -> None:
        """load_state_dict with the mismatches named: missing or unexpected weights, wrong shapes."""
        own = self.state_dict()
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own))
        shapes = [f"{k}: {list(state[k].shape)} (expected {list(own[k].shape)})" for k in own
                  if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
        if missing or unexpected or shapes:
            raise ValueError(f"flashgla: {source}: the weights do not fit the config: missing {missing}, "
                             f"unexpected {unexpected}, wrong shapes {shapes}")
        self.load_state_dict(state)
