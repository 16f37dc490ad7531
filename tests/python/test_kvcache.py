"""flash_attention_with_kvcache: results against a pure-PyTorch fp64 attention over each sequence's
gathered keys (contiguous and paged caches, GQA, one and several queries, appends, empty and full
caches), the in-place append, argument errors, opcheck; the hybrid model generating a left-padded
batch in one batch; and (with a GPU) the CUDA kernels and a CUDA-graph capture of the op."""

import pytest
import torch

import flashgla
from flashgla.models import GLAConfig, GLAForCausalLM
from testing_utils import TOLERANCE, assert_close, naive_attention, poisoned_outputs, randn


def make_case(gen, B, Tq, Hq, Hkv, D, Dv, capacity, lens, paged=0, append=False, dtype=torch.float64,
              device="cpu"):
    """Inputs, and the keys/values each sequence should see after the call (fp64 reference)."""
    q = randn(gen, B, Tq, Hq, D, dtype=dtype)
    if paged:
        max_blocks = capacity // paged
        num_blocks = B * max_blocks + 2
        k_cache = randn(gen, num_blocks, paged, Hkv, D, dtype=dtype)
        v_cache = randn(gen, num_blocks, paged, Hkv, Dv, dtype=dtype)
        block_table = torch.randperm(num_blocks, generator=gen)[:B * max_blocks].view(B, max_blocks).to(torch.int32)
    else:
        k_cache = randn(gen, B, capacity, Hkv, D, dtype=dtype)
        v_cache = randn(gen, B, capacity, Hkv, Dv, dtype=dtype)
        block_table = None
    k = randn(gen, B, Tq, Hkv, D, dtype=dtype) if append else None
    v = randn(gen, B, Tq, Hkv, Dv, dtype=dtype) if append else None

    def rows(b, length):
        if block_table is None:
            return k_cache[b, :length], v_cache[b, :length]
        j = torch.arange(length)
        blocks = block_table[b, j // paged].long()
        return k_cache[blocks, j % paged], v_cache[blocks, j % paged]

    expected = []
    for b in range(B):
        keys, values = rows(b, lens[b])
        if append:
            keys, values = torch.cat([keys, k[b]]), torch.cat([values, v[b]])
        expected.append((keys.double(), values.double()))
    cache_seqlens = torch.tensor(lens, dtype=torch.int32)
    to = (lambda t: None if t is None else t.to(device))
    return dict(q=to(q), k_cache=to(k_cache), v_cache=to(v_cache), cache_seqlens=to(cache_seqlens),
                block_table=to(block_table), k=to(k), v=to(v)), expected


def reference(inputs, expected, causal=True):
    q = inputs["q"].cpu()
    out = []
    for b, (keys, values) in enumerate(expected):
        if keys.shape[0] == 0:
            out.append(torch.zeros(q.shape[1], q.shape[2], values.shape[-1], dtype=torch.float64))
        else:
            out.append(naive_attention(q[b:b + 1], keys[None], values[None], causal=causal)[0])
    return torch.stack(out)


CASES = {  # B, Tq, Hq, Hkv, D, Dv, capacity, lens, paged, append
    "decode": (3, 1, 4, 2, 32, 32, 64, [0, 64, 17], 0, False),
    "decode_append": (3, 1, 4, 2, 32, 32, 64, [0, 63, 17], 0, True),
    "chunk_append_mqa": (2, 6, 4, 1, 16, 24, 48, [0, 30], 0, True),
    "chunk_few_keys": (2, 5, 2, 2, 16, 16, 40, [2, 40], 0, False),
    "paged": (3, 1, 4, 2, 32, 32, 64, [0, 64, 33], 16, False),
    "paged_append": (2, 3, 6, 3, 32, 32, 96, [5, 93], 8, True),
}


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", list(CASES))
def test_matches_reference(gen, case, dtype, causal):
    B, Tq, Hq, Hkv, D, Dv, capacity, lens, paged, append = CASES[case]
    inputs, expected = make_case(gen, B, Tq, Hq, Hkv, D, Dv, capacity, lens, paged, append, dtype)
    with poisoned_outputs():
        o, lse = flashgla.flash_attention_with_kvcache(**inputs, causal=causal, return_softmax_lse=True)
    assert o.dtype == dtype and o.shape == (B, Tq, Hq, Dv) and lse.shape == (B, Hq, Tq)
    assert_close(o, reference(inputs, expected, causal), TOLERANCE[dtype], "o")
    if append:  # the new keys and values are in the cache now
        for b, (keys, values) in enumerate(expected):
            L = keys.shape[0]
            j = torch.arange(L - Tq, L)
            if paged:
                blocks = inputs["block_table"][b, j // paged].long()
                got_k, got_v = inputs["k_cache"][blocks, j % paged], inputs["v_cache"][blocks, j % paged]
            else:
                got_k, got_v = inputs["k_cache"][b, L - Tq:L], inputs["v_cache"][b, L - Tq:L]
            assert torch.equal(got_k, inputs["k"][b]) and torch.equal(got_v, inputs["v"][b])


def test_argument_errors(gen):
    inputs, _ = make_case(gen, 2, 1, 4, 2, 16, 16, 32, [3, 32], 8, False, torch.float32)
    f = flashgla.flash_attention_with_kvcache
    with pytest.raises(TypeError, match="cache_seqlens"):
        f(**{**inputs, "cache_seqlens": inputs["cache_seqlens"].long()})
    with pytest.raises(ValueError, match="cache_seqlens"):
        f(**{**inputs, "cache_seqlens": torch.tensor([3, 33], dtype=torch.int32)})
    with pytest.raises(ValueError, match="block_table"):
        f(**{**inputs, "block_table": torch.full_like(inputs["block_table"], 99)})
    with pytest.raises(ValueError, match="flashgla: v: "):
        f(**inputs_with(inputs, k=torch.zeros(2, 1, 2, 16)))
    with pytest.raises(ValueError, match="k_cache"):
        f(**inputs_with(inputs, q=torch.zeros(2, 1, 3, 16)))
    with pytest.raises(TypeError, match="k_cache"):
        f(**inputs_with(inputs, k_cache=inputs["k_cache"].double()))
    with pytest.raises(ValueError, match="max_seqlen_k"):
        f(**inputs, max_seqlen_k=-1)
    with pytest.raises(TypeError, match="q"):
        f(**inputs_with(inputs, q=[1.0]))


def inputs_with(inputs, **changes):
    return {**inputs, **changes}


def test_opcheck(gen):
    inputs, _ = make_case(gen, 2, 2, 4, 2, 16, 16, 32, [3, 20], 8, True, torch.float32)
    args = (inputs["q"], inputs["k_cache"], inputs["v_cache"], inputs["cache_seqlens"], inputs["block_table"],
            inputs["k"], inputs["v"], True, None, None, 0)
    torch.library.opcheck(torch.ops.flashgla.flash_attention_with_kvcache.default, args,
                          test_utils=("test_schema", "test_faketensor"))


class _AnyFunctionMode(torch.overrides.TorchFunctionMode):
    """A mode that changes nothing: with it active the call goes through the custom op's dispatch."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_eager_call_and_custom_op_agree(gen):
    """A plain eager call skips the custom op's dispatch: the same outputs and cache writes as through it, and
    the written caches' version counters move as the op's mutation bookkeeping moves them."""
    inputs, _ = make_case(gen, 2, 2, 4, 2, 16, 16, 32, [3, 20], 8, True, torch.float32)
    through_op = {name: t.clone() if t is not None else None for name, t in inputs.items()}
    versions = inputs["k_cache"]._version, inputs["v_cache"]._version
    o, lse = flashgla.flash_attention_with_kvcache(**inputs, return_softmax_lse=True)
    assert (inputs["k_cache"]._version, inputs["v_cache"]._version) == (versions[0] + 1, versions[1] + 1)
    with _AnyFunctionMode():
        o_op, lse_op = flashgla.flash_attention_with_kvcache(**through_op, return_softmax_lse=True)
    assert torch.equal(o, o_op) and torch.equal(lse, lse_op)
    for cache in ("k_cache", "v_cache"):
        assert torch.equal(inputs[cache], through_op[cache]), cache


def tiny_hybrid(seed, dtype=torch.float64, device="cpu", hidden_size=32, attn_heads=(4, 2)):
    torch.manual_seed(seed)
    config = GLAConfig(vocab_size=40, hidden_size=hidden_size, num_hidden_layers=3, num_heads=2,
                       use_short_conv=True, attn_layers=[0, 2], attn_num_heads=attn_heads[0],
                       attn_num_kv_heads=attn_heads[1])
    return GLAForCausalLM(config).to(device=device, dtype=dtype).eval()


@pytest.mark.parametrize("cuda_graph", [False, True], ids=["eager", "static"])
def test_padded_hybrid_batch_generates_as_each_prompt_alone(cuda_graph):
    model = tiny_hybrid(3)
    lengths = (7, 2, 5)
    prompts = [torch.randint(0, 40, (n,), generator=torch.Generator().manual_seed(10 + n)) for n in lengths]
    T = max(lengths)
    ids = torch.zeros(len(prompts), T, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, prompt in enumerate(prompts):
        ids[b, T - len(prompt):], mask[b, T - len(prompt):] = prompt, 1
    batches = []
    hook = model.register_forward_pre_hook(lambda module, args: batches.append(args[0].shape[0]))
    try:
        batched = model.generate(ids, 8, attention_mask=mask, cuda_graph=cuda_graph)
    finally:
        hook.remove()
    assert batches and all(n == len(prompts) for n in batches)  # one batch, never one sequence at a time
    for b, prompt in enumerate(prompts):
        alone = model.generate(prompt.unsqueeze(0), 8, cuda_graph=False)
        assert torch.equal(batched[b, T:], alone[0, len(prompt):]), f"prompt {b}"


cuda = pytest.mark.skipif(not flashgla.cuda_available(), reason="needs a CUDA build of flashgla and a GPU")


@cuda
@pytest.mark.parametrize("case", ["decode_append", "paged_append", "long"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_kvcache_gpu_matches_reference(gen, case, dtype):
    if case == "long":  # batch 1, long cache: the split (flash-decoding) path
        B, Tq, Hq, Hkv, D, Dv, capacity, lens, paged, append = 1, 1, 8, 2, 128, 128, 8192, [8000], 64, True
    else:
        B, Tq, Hq, Hkv, _, _, capacity, lens, paged, append = CASES[case]
        D = Dv = 64
    inputs, expected = make_case(gen, B, Tq, Hq, Hkv, D, Dv, capacity, lens, paged, append, dtype, "cuda")
    with poisoned_outputs():
        o = flashgla.flash_attention_with_kvcache(**inputs)
    assert_close(o, reference(inputs, expected), TOLERANCE[dtype], "o")


@cuda
def test_kvcache_gpu_cuda_graph_capture(gen):
    """Captured once, replayed with new queries and lengths written into the same buffers."""
    B, Hq, Hkv, D, capacity = 4, 8, 2, 128, 4096
    dtype, device = torch.bfloat16, "cuda"
    k_cache = randn(gen, B, capacity, Hkv, D, dtype=dtype).to(device)
    v_cache = randn(gen, B, capacity, Hkv, D, dtype=dtype).to(device)
    q = torch.zeros(B, 1, Hq, D, dtype=dtype, device=device)
    lens = torch.zeros(B, dtype=torch.int32, device=device)

    def step():
        return flashgla.flash_attention_with_kvcache(q, k_cache, v_cache, lens, max_seqlen_k=capacity)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for trial in range(3):
        q.copy_(randn(gen, B, 1, Hq, D, dtype=dtype))
        lens.copy_(torch.randint(0, capacity + 1, (B,), generator=gen, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        expected = [(k_cache[b, :int(lens[b])].cpu().double(), v_cache[b, :int(lens[b])].cpu().double())
                    for b in range(B)]
        assert_close(out, reference({"q": q}, expected), TOLERANCE[dtype], f"replay {trial}")


@cuda
@pytest.mark.parametrize("hidden_size", [128, 32], ids=["D64_kernel", "D8_masked_fallback"])
def test_kvcache_gpu_padded_hybrid_generation(hidden_size):
    model = tiny_hybrid(5, torch.float32, "cuda", hidden_size, (2, 1))
    ids = torch.randint(0, 40, (3, 9), generator=torch.Generator().manual_seed(4)).cuda()
    mask = torch.ones_like(ids)
    mask[1, :4] = 0
    mask[2, :7] = 0
    graph = model.generate(ids, 12, attention_mask=mask, cuda_graph=True)
    eager = model.generate(ids, 12, attention_mask=mask, cuda_graph=False)
    assert torch.equal(graph, eager)


def test_layer_masked_fallback_matches_the_op(gen):
    """Where flash_attention_with_kvcache does not run (CUDA with other head dims, fp64 on CUDA) the layer
    appends and attends through index writes and masked SDPA: the same result and cache."""
    from flashgla.nn.attention import Attention, KVCache

    torch.manual_seed(0)
    layer = Attention(32, 4, 2).double()
    B, capacity = 3, 20
    for T in (1, 3):
        k_cache, v_cache = randn(gen, B, capacity, 2, 8), randn(gen, B, capacity, 2, 8)
        lengths = torch.tensor([0, 5, capacity - T], dtype=torch.int32)
        q, k, v = randn(gen, B, T, 4, 8), randn(gen, B, T, 2, 8), randn(gen, B, T, 2, 8)
        positions = lengths.long()[:, None] + torch.arange(T)
        caches = [KVCache(k_cache.clone(), v_cache.clone(), capacity - T, seqlens=lengths.clone()) for _ in range(2)]
        with poisoned_outputs():
            op = layer._attend_cache(q, k, v, caches[0], caches[0].seqlens, positions, None)
        masked = layer._attend_cache_masked(q, k, v, caches[1], positions)
        assert_close(op, masked, 1e-12, f"T={T}")
        assert torch.equal(caches[0].k, caches[1].k) and torch.equal(caches[0].v, caches[1].v)
