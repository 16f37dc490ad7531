"""flashgla's GLA language model as a Hugging Face transformers model (the optional extra flashgla[hf]).

    import flashgla                                   # registers the model type with transformers
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained("ckpt", dtype=torch.bfloat16, device_map="cuda")
    out = model.generate(input_ids, max_new_tokens=50, do_sample=True, top_p=0.9)

FlashGLAConfig (model type "flashgla_gla", so FLA's "gla" can live in the same environment) holds the
fields of flashgla.models.GLAConfig; FlashGLAForCausalLM wraps flashgla.models.GLAForCausalLM (the one
network implementation, under the attribute `model`) as a PreTrainedModel with GenerationMixin, and
GLACache is a transformers Cache holding each layer's GLA state or, in hybrid attention layers, KV cache.
Importing this module registers both classes with AutoConfig and AutoModelForCausalLM.
"""

from dataclasses import fields
from typing import Optional

import torch
from torch import Tensor

try:
    import transformers  # noqa: F401
except ImportError as error:
    raise ImportError("flashgla.models.hf needs transformers: pip install 'flashgla[hf]' (or pip install "
                      f"transformers safetensors accelerate) ({error})") from error
from transformers import AutoConfig, AutoModelForCausalLM, GenerationMixin, PreTrainedModel
from transformers import __version__ as _transformers_version
from transformers.cache_utils import Cache as _HFCache
from transformers.modeling_outputs import CausalLMOutputWithPast

try:
    from transformers import PreTrainedConfig as _HFConfig  # transformers >= 5
except ImportError:  # pragma: no cover - transformers 4.x
    from transformers import PretrainedConfig as _HFConfig

from ..nn.attention import KVCache
from ..nn.conv import ShortConvolution
from ..nn.gla import GLAState
from ..nn.norm import GatedRMSNorm, RMSNorm
from ..nn.padding import has_padding
from .checkpoint import HF_MODEL_TYPE, weights_problem
from .config import GLAConfig, config_source
from .gla_lm import Cache as _CoreCache
from .gla_lm import GLAForCausalLM, _GraphDecoder

__all__ = ["FlashGLAConfig", "FlashGLAForCausalLM", "GLACache", "register"]

_CORE_FIELDS = tuple(f.name for f in fields(GLAConfig))
_TRANSFORMERS_MAJOR = int(_transformers_version.split(".")[0])
# The cache's keyword and output field: `cache` in recent transformers, `past_key_values` before.
_CACHE_KEY = "cache" if "cache" in getattr(CausalLMOutputWithPast, "__dataclass_fields__", {}) else "past_key_values"


class FlashGLAConfig(_HFConfig):
    """transformers configuration of flashgla's GLA model: the fields of flashgla.models.GLAConfig
    (checked by it) plus transformers' own (token ids, ...)."""

    model_type = HF_MODEL_TYPE
    keys_to_ignore_at_inference = ["past_key_values"]

    def __init__(self, **kwargs):
        # transformers does not say which file the values come from: the errors name the config class and file.
        with config_source(f"FlashGLAConfig ({HF_MODEL_TYPE}, config.json)"):
            core = GLAConfig(**{name: kwargs.pop(name) for name in _CORE_FIELDS if name in kwargs})
        for name, value in core.to_dict().items():
            setattr(self, name, value)
        kwargs.setdefault("tie_word_embeddings", core.tie_word_embeddings)
        super().__init__(**kwargs)
        self.tie_word_embeddings = bool(kwargs["tie_word_embeddings"])

    def to_core(self) -> GLAConfig:
        values = {name: getattr(self, name) for name in _CORE_FIELDS}
        values["tie_word_embeddings"] = bool(self.tie_word_embeddings)
        return GLAConfig(**values)

    @classmethod
    def from_core(cls, config: GLAConfig, **kwargs) -> "FlashGLAConfig":
        return cls(**config.to_dict(), **kwargs)


class GLACache(_CoreCache, _HFCache):
    """A transformers Cache holding flashgla's per-layer generation states: a GLAState (recurrent state
    [N, H, K, V] fp32, updated in place by decoding, and the short-convolution inputs) for GLA layers, a
    KVCache for attention layers. flashgla's model reads and updates it as its own Cache."""

    is_compileable = False

    def __init__(self, num_layers: int, capacity: Optional[int] = None):
        _CoreCache.__init__(self, num_layers)  # transformers' Cache keeps transformers' layer objects: not used
        self.capacity = capacity  # the most tokens generate() will see (static KV caches for a CUDA graph)
        self.decoder = None       # the CUDA-graph decode step on this cache, once made

    def release_decoder(self) -> None:
        if self.decoder is not None:
            self.decoder.release()
            self.decoder = None

    def get_seq_length(self, layer_idx: Optional[int] = 0) -> int:
        return self.seen_tokens

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        return -1  # grows as needed

    def get_max_length(self):  # transformers 4.x name
        return None

    @property
    def is_sliding(self):
        return [False] * len(self.layers)

    def _map(self, fn) -> None:
        self.release_decoder()  # new tensors: the graph's buffers are gone
        for i, state in enumerate(self.layers):
            if isinstance(state, GLAState):
                conv = None if state.conv is None else tuple(fn(c) for c in state.conv)
                self.layers[i] = GLAState(fn(state.recurrent), conv)
            elif isinstance(state, KVCache):
                seqlens = None if state.seqlens is None else fn(state.seqlens)
                self.layers[i] = KVCache(fn(state.k), fn(state.v), state.length, seqlens=seqlens)

    def reorder_cache(self, beam_idx: Tensor) -> None:
        """Beam search: row b becomes row beam_idx[b] (in place: a captured decode step keeps its buffers)."""
        for state in self.layers:
            tensors = ([state.recurrent, *(state.conv or ())] if isinstance(state, GLAState)
                       else [state.k, state.v, *([] if state.seqlens is None else [state.seqlens])]
                       if isinstance(state, KVCache) else [])
            for t in tensors:
                t.copy_(t.index_select(0, beam_idx.to(t.device)))

    def batch_select_indices(self, indices: Tensor) -> None:
        self._map(lambda t: t[indices.to(t.device)])

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map(lambda t: t.repeat_interleave(repeats, dim=0))

    def crop(self, max_length: int) -> None:
        raise NotImplementedError("flashgla: GLACache.crop: a GLA state cannot be rolled back to an earlier "
                                  "length (assisted generation is not supported)")


class FlashGLAForCausalLM(PreTrainedModel, GenerationMixin):
    """flashgla.models.GLAForCausalLM (attribute `model`) as a transformers causal LM. Parameter names
    are `model.` + flashgla's (embeddings, layers.N.attn..., norm, lm_head)."""

    config_class = FlashGLAConfig
    base_model_prefix = "flashgla"
    main_input_name = "input_ids"
    _no_split_modules = ["GLABlock"]
    _is_stateful = True            # generation states are not transformers' KV caches
    # generate(): on CUDA the one-token decode step is captured in a CUDA graph and replayed (None: on
    # CUDA; True: also on the CPU, where the same static-shape step runs eagerly; False: never).
    cuda_graph: Optional[bool] = None
    _supports_cache_class = True
    supports_gradient_checkpointing = False
    if _TRANSFORMERS_MAJOR >= 5:
        _tied_weights_keys = {"model.lm_head.weight": "model.embeddings.weight"}
    else:  # pragma: no cover - transformers 4.x
        _tied_weights_keys = ["model.lm_head.weight"]

    def __init__(self, config: FlashGLAConfig):
        super().__init__(config)
        self.model = GLAForCausalLM(config.to_core())
        self.post_init()

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """transformers' from_pretrained; when it fails on a local directory whose weight files are truncated,
        corrupt or of another format, a ValueError naming the file says so (transformers' safetensors reader
        names none)."""
        try:
            return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        except Exception:
            problem = weights_problem(str(pretrained_model_name_or_path))
            if problem is None:
                raise
        raise ValueError(problem)

    # ---- what transformers asks of a model ------------------------------------------------------------

    def get_input_embeddings(self):
        return self.model.embeddings

    def set_input_embeddings(self, value):
        self.model.embeddings = value

    def get_output_embeddings(self):
        return self.model.lm_head

    def set_output_embeddings(self, value):
        self.model.lm_head = value

    @torch.no_grad()
    def _init_weights(self, module):
        """Weights transformers did not load (or a fresh model): flashgla's initialization."""
        std = self.config.initializer_range
        if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            module.weight.normal_(0.0, std)
            if getattr(module, "bias", None) is not None:
                module.bias.zero_()
        elif isinstance(module, (RMSNorm, GatedRMSNorm)):
            module.weight.fill_(1.0)
        elif isinstance(module, ShortConvolution):
            bound = module.kernel_size ** -0.5
            module.weight.uniform_(-bound, bound)

    def forward(self, input_ids: Optional[Tensor] = None, attention_mask: Optional[Tensor] = None,
                past_key_values: Optional[GLACache] = None, inputs_embeds: Optional[Tensor] = None,
                labels: Optional[Tensor] = None, use_cache: Optional[bool] = None,
                return_dict: Optional[bool] = None, logits_to_keep: int = 0, cu_seqlens: Optional[Tensor] = None,
                cache: Optional[GLACache] = None, **kwargs) -> CausalLMOutputWithPast:
        """input_ids [B, T]; attention_mask [B, T] (padding); past_key_values: a GLACache (created when
        use_cache is set and none is given); labels [B, T] (shifted inside, -100 ignored); logits_to_keep:
        only the last n positions' logits (0: all). Other keyword arguments (transformers' position ids,
        cache positions, ...) are accepted and not needed. `cache` is the newer name of past_key_values."""
        if cache is not None:
            if past_key_values is not None:
                raise ValueError("flashgla: cache: give either cache or past_key_values, not both")
            past_key_values = cache
        if inputs_embeds is not None:
            raise NotImplementedError("flashgla: inputs_embeds: not supported, pass input_ids")
        if input_ids is None:
            raise ValueError("flashgla: input_ids: required")
        if past_key_values is not None and not isinstance(past_key_values, _CoreCache):
            raise TypeError(f"flashgla: past_key_values: expected a flashgla GLACache, got "
                            f"{type(past_key_values).__name__}")
        if use_cache is None:  # transformers' default, except where a cache is useless or cannot be kept
            use_cache = (getattr(self.config, "use_cache", True) and not self.training and labels is None
                         and not (self.config.attn_layers and self.config.attn_backend != "flashgla"
                                  and has_padding(attention_mask)))
        if use_cache and past_key_values is None:
            past_key_values = GLACache(len(self.model.layers))
        if past_key_values is not None and past_key_values.seen_tokens > 0 and attention_mask is not None:
            # Padding was packed away at the prefill; the decode steps' mask (all ones for new tokens) is not needed.
            attention_mask = None
        decoder = self._decoder(input_ids, past_key_values, use_cache, labels, cu_seqlens)
        if decoder is not None:
            # a copy: the graph's output buffer is overwritten by the next step, transformers may keep this one
            logits = decoder(input_ids[:, 0]).unsqueeze(1).clone()
            return CausalLMOutputWithPast(logits=logits, **{_CACHE_KEY: past_key_values})
        out = self.model(input_ids, attention_mask=attention_mask, cu_seqlens=cu_seqlens, labels=labels,
                         cache=past_key_values, use_cache=bool(use_cache), logits_to_keep=logits_to_keep)
        return CausalLMOutputWithPast(loss=out.loss, logits=out.logits,
                                      **{_CACHE_KEY: past_key_values if use_cache else None})

    def _decoder(self, input_ids, cache, use_cache, labels, cu_seqlens):
        """The cache's graph decode step when this call is one (one token per sequence after a prefill,
        within the capacity generate() announced, no gradients), else None (and the static KV caches
        go back to ordinary ones when the capacity is used up)."""
        if not isinstance(cache, GLACache) or cache.capacity is None:
            return None
        wanted = self.cuda_graph if self.cuda_graph is not None else input_ids.is_cuda
        fits = cache.seen_tokens + 1 <= cache.capacity
        if not (wanted and use_cache and fits and cache.seen_tokens > 0 and input_ids.shape[1] == 1
                and labels is None and cu_seqlens is None and not torch.is_grad_enabled()):
            if not fits or input_ids.shape[1] != 1:
                cache.release_decoder()
            return None
        if cache.decoder is None or cache.decoder.batch != input_ids.shape[0]:
            cache.release_decoder()
            cache.decoder = _GraphDecoder(self.model, cache, input_ids.shape[0], cache.capacity)
        return cache.decoder

    def _prepare_cache_for_generation(self, generation_config, model_kwargs: dict, *args, **kwargs) -> None:
        """generate() starts from an empty GLACache (transformers would make a DynamicCache of keys and values)."""
        given = model_kwargs.get("cache", model_kwargs.get("past_key_values"))
        if given is not None:
            if not isinstance(given, GLACache):
                raise TypeError(f"flashgla: {_CACHE_KEY}: expected a GLACache, got {type(given).__name__}")
            return
        if generation_config.use_cache is not False:
            model_kwargs[_CACHE_KEY] = GLACache(len(self.model.layers), generation_config.max_length)

    def prepare_inputs_for_generation(self, input_ids: Tensor, past_key_values: Optional[GLACache] = None,
                                      attention_mask: Optional[Tensor] = None, use_cache: bool = True,
                                      logits_to_keep: Optional[int] = None, cache: Optional[GLACache] = None,
                                      **kwargs) -> dict:
        cache = cache if cache is not None else past_key_values
        if cache is not None and cache.seen_tokens > 0:
            input_ids = input_ids[:, min(cache.seen_tokens, input_ids.shape[1] - 1):]  # the new tokens
            attention_mask = None
        inputs = {"input_ids": input_ids, _CACHE_KEY: cache, "attention_mask": attention_mask, "use_cache": use_cache}
        if logits_to_keep is not None:
            inputs["logits_to_keep"] = logits_to_keep
        return inputs

    def _reorder_cache(self, past_key_values: GLACache, beam_idx: Tensor) -> GLACache:  # transformers 4.x
        past_key_values.reorder_cache(beam_idx)
        return past_key_values


_registered = False


def register() -> None:
    """Registers FlashGLAConfig / FlashGLAForCausalLM with AutoConfig and AutoModelForCausalLM (once)."""
    global _registered
    if _registered:
        return
    AutoConfig.register(HF_MODEL_TYPE, FlashGLAConfig, exist_ok=True)
    AutoModelForCausalLM.register(FlashGLAConfig, FlashGLAForCausalLM, exist_ok=True)
    _registered = True


register()
