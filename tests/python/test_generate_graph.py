"""generate() with the static-shape decode step (cuda_graph): GLA states and short-convolution inputs
updated in place, hybrid attention over a KV cache preallocated to the final length with a device-side
position. On the CPU the static step runs eagerly and must give the tokens of the ordinary eager
decode; on CUDA (skipped without) the step is captured in a CUDA graph and replayed."""

import pytest

torch = pytest.importorskip("torch")

import flashgla  # noqa: E402
from flashgla.models import GLAConfig, GLAForCausalLM  # noqa: E402

@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Tiny matrices: one torch thread is fastest, and stays fast on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


HYBRID = dict(attn_layers=[1], attn_num_heads=4, attn_num_kv_heads=2)
CASES = [dict(), dict(use_short_conv=True, num_kv_heads=1), dict(use_short_conv=True, **HYBRID)]


def tiny(seed, dtype, device="cpu", **options):
    torch.manual_seed(seed)
    values = dict(vocab_size=40, hidden_size=32, num_hidden_layers=3, num_heads=2)
    values.update(options)
    return GLAForCausalLM(GLAConfig(**values)).to(device=device, dtype=dtype).eval()


def count_forward_calls(model):
    calls = []
    handle = model.register_forward_pre_hook(lambda module, args: calls.append(args[0].shape[1]))
    return calls, handle


@pytest.mark.parametrize("options", CASES)
def test_static_decode_step_matches_eager_decoding_on_the_cpu(options):
    model = tiny(1, torch.float64, **options)
    prompt = torch.randint(0, 40, (3, 7), generator=torch.Generator().manual_seed(2))
    eager = model.generate(prompt, 9, cuda_graph=False)
    static = model.generate(prompt, 9, cuda_graph=True)
    assert torch.equal(static, eager)
    with torch.no_grad():  # and both continue with the argmax of a full forward pass
        logits = model(static).logits
    assert torch.equal(logits[:, 6:-1].argmax(-1), static[:, 7:])
    sampled = [model.generate(prompt, 6, do_sample=True, top_k=5, cuda_graph=graph,
                              generator=torch.Generator().manual_seed(3)) for graph in (False, True)]
    assert torch.equal(sampled[0], sampled[1])


def test_static_decode_with_left_padding_on_the_cpu():
    model = tiny(4, torch.float64, use_short_conv=True)
    ids = torch.randint(0, 40, (2, 6), generator=torch.Generator().manual_seed(5))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, :2] = 0
    assert torch.equal(model.generate(ids, 5, attention_mask=mask, cuda_graph=True),
                       model.generate(ids, 5, attention_mask=mask, cuda_graph=False))


cuda = pytest.mark.skipif(not flashgla.cuda_available(), reason="needs a CUDA build of flashgla and a GPU")


@cuda
@pytest.mark.parametrize("options", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graph_generation_replays_and_matches_eager(options, dtype):
    model = tiny(6, dtype, "cuda", **options)
    prompt = torch.randint(0, 40, (4, 9), generator=torch.Generator().manual_seed(7)).cuda()
    eager = model.generate(prompt, 12, cuda_graph=False)
    calls, handle = count_forward_calls(model)
    graphed = model.generate(prompt, 12)  # automatic on CUDA
    handle.remove()
    # prefill, the warm-up step and the capture run Python; the remaining 8 steps are graph replays
    assert calls == [9, 1, 1], calls
    if dtype == torch.float32:
        assert torch.equal(graphed, eager)
    else:  # bf16: a near-tie may flip one argmax, after which the two continuations differ; every graphed
        # token must still be the (near) argmax of a full forward pass of its prefix (below)
        assert torch.equal(graphed[:, :10], eager[:, :10])
    with torch.no_grad():
        logits = model(graphed).logits.float()
    picked = logits[:, 8:-1].gather(-1, graphed[:, 9:].unsqueeze(-1)).squeeze(-1)
    assert torch.all(picked >= logits[:, 8:-1].max(-1).values - (1e-4 if dtype == torch.float32 else 0.1))


@cuda
def test_cuda_graph_generation_twice_and_eos():
    model = tiny(8, torch.float32, "cuda", use_short_conv=True, **HYBRID)
    prompt = torch.randint(0, 40, (2, 5), generator=torch.Generator().manual_seed(9)).cuda()
    first, second = model.generate(prompt, 10), model.generate(prompt, 10)
    assert torch.equal(first, second)
    eos = int(first[0, 5])
    stopped = model.generate(prompt, 10, eos_token_id=eos)
    assert torch.all(stopped[0, 5:] == eos) and stopped.shape == (2, 15)
