"""The fused norm/gate ops and the GLA layer (flashgla.ops.norm, flashgla.nn): against plain torch
references of the paper's formulas, between the chunked and recurrent modes, padded vs packed
batches, generation with the state cache, gradients, and bad configurations. Tiny sizes: CPU."""

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F  # noqa: E402
from flashgla.nn import GatedLinearAttention, ShortConvolution  # noqa: E402
from flashgla.ops.norm import logsigmoid_gate, rms_norm, rms_norm_gated  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """The matrices here are tiny: one torch thread is fastest, and stays fast on a busy machine
    (waking a second thread for each small product can cost milliseconds)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))]


def rel_error(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


# ---- fused ops --------------------------------------------------------------------------------------------

def reference_rms_norm_gated(x, gate, weight, eps, activation):
    x64 = x.double()
    y = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.double()
    if gate is not None:
        y = y * (F.silu(gate.double()) if activation == "swish" else torch.sigmoid(gate.double()))
    return y


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("activation", ["swish", "sigmoid"])
def test_rms_norm_gated_matches_reference(device, dtype, activation):
    torch.manual_seed(0)
    x = (torch.randn(2, 9, 3, 32, device=device) + 0.3).to(dtype).requires_grad_()
    gate = torch.randn(2, 9, 3, 32, device=device).to(dtype).requires_grad_()
    weight = (1 + 0.3 * torch.randn(32, device=device)).requires_grad_()
    y = rms_norm_gated(x, gate, weight, 1e-5, activation)
    assert y.dtype == dtype
    x_ref, gate_ref, weight_ref = (t.detach().double().requires_grad_() for t in (x, gate, weight))
    y_ref = reference_rms_norm_gated(x_ref, gate_ref, weight_ref, 1e-5, activation)
    dy = torch.randn_like(y_ref).to(dtype).double()  # representable in dtype: both sides see the same dy
    y.backward(dy.to(dtype))
    y_ref.backward(dy)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert rel_error(y, y_ref) < tol
    assert rel_error(x.grad, x_ref.grad) < tol
    assert rel_error(gate.grad, gate_ref.grad) < tol
    assert rel_error(weight.grad, weight_ref.grad) < 1e-4
    assert weight.grad.dtype == weight.dtype


def test_rms_norm_on_a_strided_slice_and_expanded_gradient():
    torch.manual_seed(1)
    wide = torch.randn(4, 7, 48, dtype=torch.float64)
    x = wide[..., 8:40].requires_grad_()  # a slice of a fused projection: not contiguous
    weight = torch.randn(32, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, w: rms_norm(a, w, 1e-4), (x, weight))
    rms_norm(x, weight).sum().backward()  # the gradient arrives expanded (stride 0)
    x_ref = x.detach().clone().requires_grad_()
    reference_rms_norm_gated(x_ref, None, weight.detach(), 1e-6, "swish").sum().backward()
    assert rel_error(x.grad, x_ref.grad) < 1e-12


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("clamp_min", [None, -0.1])
def test_logsigmoid_gate_matches_reference(device, clamp_min):
    torch.manual_seed(2)
    x = (4 * torch.randn(3, 20, 16, device=device)).requires_grad_()
    g = logsigmoid_gate(x, 16.0, clamp_min)
    x_ref = x.detach().double().requires_grad_()
    g_ref = F.logsigmoid(x_ref) / 16
    if clamp_min is not None:
        g_ref = g_ref.clamp_min(clamp_min)
    dg = torch.randn_like(g_ref)
    g.backward(dg.float())
    g_ref.backward(dg)
    assert rel_error(g, g_ref) < 1e-6
    assert rel_error(x.grad, x_ref.grad) < 1e-6
    assert logsigmoid_gate(x.detach().bfloat16(), float32_output=True).dtype == torch.float32


def test_fused_ops_report_bad_input():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match="weight"):
        rms_norm(x, torch.ones(7))
    with pytest.raises(TypeError, match="gate"):
        rms_norm_gated(x, torch.randn(2, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="activation"):
        rms_norm_gated(x, x, activation="relu")
    with pytest.raises(ValueError, match="normalizer"):
        logsigmoid_gate(x, normalizer=0.0)
    with pytest.raises(ValueError, match="eps"):
        rms_norm(x, eps=-1.0)


# ---- the layer against the paper's recurrence written in torch ----------------------------------------------

def reference_layer(layer, x):
    """GLA layer of §4.4 computed token by token in fp64 (no padding, no cache, no short conv)."""
    B, T, _ = x.shape
    H, K, V = layer.num_heads, layer.head_k_dim, layer.head_v_dim
    groups = layer.num_kv_groups
    q = layer.q_proj(x).view(B, T, H, K)
    k = layer.k_proj(x).view(B, T, -1, K).repeat_interleave(groups, 2)
    v = layer.v_proj(x).view(B, T, -1, V).repeat_interleave(groups, 2)
    g = F.logsigmoid(layer.gk_proj(x)) / layer.gate_logit_normalizer
    if layer.clamp_min is not None:
        g = g.clamp_min(layer.clamp_min)
    g = g.view(B, T, -1, K).repeat_interleave(groups, 2)
    state = x.new_zeros(B, H, K, V)
    outputs = []
    for t in range(T):
        state = state * g[:, t].exp().unsqueeze(-1) + k[:, t].unsqueeze(-1) * v[:, t].unsqueeze(-2)
        outputs.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * K ** -0.5, state))
    o = torch.stack(outputs, 1)
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + layer.g_norm.eps) * layer.g_norm.weight
    if layer.use_output_gate:
        r = layer.g_proj(x).view(B, T, H, V)
        o = o * (F.silu(r) if layer.g_norm.activation in ("swish", "silu") else torch.sigmoid(r))
    return layer.o_proj(o.reshape(B, T, -1))


@pytest.mark.parametrize("options", [
    dict(),
    dict(num_kv_heads=2, clamp_min=-0.05),
    dict(use_output_gate=False, expand_k=1.0, expand_v=2.0),
    dict(gate_fn="sigmoid", gate_low_rank_dim=4),
])
def test_layer_matches_the_recurrence(options):
    torch.manual_seed(3)
    layer = GatedLinearAttention(hidden_size=32, num_heads=4, **options).double()
    x = torch.randn(2, 19, 32, dtype=torch.float64)
    with torch.no_grad():
        out, _ = layer(x)
        ref = reference_layer(layer, x)
    assert rel_error(out, ref) < 1e-10


# ---- modes, padding, packing, cache ----------------------------------------------------------------------

def layer_pair(seed=4, dtype=torch.float64, **options):
    torch.manual_seed(seed)
    chunk = GatedLinearAttention(hidden_size=32, num_heads=2, mode="chunk", **options).to(dtype)
    recurrent = GatedLinearAttention(hidden_size=32, num_heads=2, mode="fused_recurrent", **options).to(dtype)
    recurrent.load_state_dict(chunk.state_dict())
    return chunk, recurrent


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("options", [dict(), dict(num_kv_heads=1, use_short_conv=True, conv_size=3)])
def test_chunk_and_recurrent_modes_agree(device, options):
    chunk, recurrent = (layer.to(device) for layer in layer_pair(dtype=torch.float32, **options))
    x = torch.randn(2, 70, 32, device=device, requires_grad=True)  # > one chunk of 64
    out_chunk, _ = chunk(x)
    out_recurrent, _ = recurrent(x)
    assert rel_error(out_chunk, out_recurrent) < 1e-4
    dy = torch.randn_like(out_chunk)
    grads_chunk = torch.autograd.grad(out_chunk, [x, *chunk.parameters()], dy)
    grads_recurrent = torch.autograd.grad(out_recurrent, [x, *recurrent.parameters()], dy)
    for a, b in zip(grads_chunk, grads_recurrent):
        assert rel_error(a, b) < 1e-3


@pytest.mark.parametrize("use_short_conv", [False, True])
def test_padded_batch_equals_packed_batch_equals_each_sequence(use_short_conv):
    layer, _ = layer_pair(use_short_conv=use_short_conv)
    lengths = [11, 3, 7]
    T = max(lengths)
    torch.manual_seed(5)
    x = torch.randn(len(lengths), T, 32, dtype=torch.float64)
    mask = torch.zeros(len(lengths), T, dtype=torch.bool)
    mask[0, :11] = True      # right padding
    mask[1, T - 3:] = True   # left padding
    mask[2, 2:9] = True      # both
    with torch.no_grad():
        padded, _ = layer(x, attention_mask=mask)
        packed_x = torch.cat([x[b, mask[b]] for b in range(len(lengths))]).unsqueeze(0)
        cu_seqlens = torch.tensor([0, 11, 14, 21], dtype=torch.int32)
        packed, _ = layer(packed_x, cu_seqlens=cu_seqlens)
        for b in range(len(lengths)):
            alone, _ = layer(x[b:b + 1, mask[b]])
            assert rel_error(padded[b, mask[b]], alone[0]) < 1e-12
            seq = packed[0, cu_seqlens[b]:cu_seqlens[b + 1]]
            assert rel_error(seq, alone[0]) < 1e-12
        assert torch.all(padded[~mask] == 0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("mode", ["chunk", "fused_recurrent"])
@pytest.mark.parametrize("use_short_conv", [False, True])
def test_cache_continues_a_sequence(mode, use_short_conv, dtype):
    chunk, recurrent = layer_pair(use_short_conv=use_short_conv, num_kv_heads=1, dtype=dtype)
    layer = chunk if mode == "chunk" else recurrent
    torch.manual_seed(6)
    x = torch.randn(3, 29, 32, dtype=dtype)
    with torch.no_grad():
        full, _ = layer(x)
        # prefill 12 tokens, a second piece of 9, then one token at a time (the decode kernel)
        first, state = layer(x[:, :12], use_cache=True)
        second, state = layer(x[:, 12:21], state=state, use_cache=True)
        steps = []
        for t in range(21, 29):
            out, state = layer(x[:, t:t + 1], state=state, use_cache=True)
            steps.append(out)
    pieces = torch.cat([first, second, *steps], dim=1)
    # fp32: the decode kernel, its state fp32; fp64: states stay fp64 (the decode kernel's are fp32 only, so
    # single tokens take the chunked op)
    assert rel_error(pieces, full) < 1e-6
    assert state.recurrent.dtype == dtype and state.recurrent.shape == (3, 2, 8, 16)


def test_cache_with_packed_sequences():
    layer, _ = layer_pair(use_short_conv=True)
    torch.manual_seed(7)
    lengths, extra = [5, 9], 4
    xs = [torch.randn(1, n + extra, 32, dtype=torch.float64) for n in lengths]
    with torch.no_grad():
        cu_seqlens = torch.tensor([0, 5, 14], dtype=torch.int32)
        _, state = layer(torch.cat([x[:, :n] for x, n in zip(xs, lengths)], 1), cu_seqlens=cu_seqlens, use_cache=True)
        continued, _ = layer(torch.cat([x[:, n:] for x, n in zip(xs, lengths)], 0), state=state)
        for b, (x, n) in enumerate(zip(xs, lengths)):
            alone, _ = layer(x)
            assert rel_error(continued[b], alone[0, n:]) < 1e-6  # states are fp32


def test_every_parameter_receives_a_gradient():
    torch.manual_seed(8)
    layer = GatedLinearAttention(hidden_size=32, num_heads=2, num_kv_heads=1, use_short_conv=True, clamp_min=-1.0)
    x = torch.randn(2, 10, 32, requires_grad=True)
    out, _ = layer(x)
    out.square().mean().backward()
    for name, parameter in layer.named_parameters():
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0, name
    assert x.grad.abs().sum() > 0


def test_short_convolution_is_causal_depthwise_conv1d():
    torch.manual_seed(9)
    conv = ShortConvolution(6, 4).double()
    x = torch.randn(2, 10, 6, dtype=torch.float64)
    y, _ = conv(x)
    ref = F.silu(F.conv1d(F.pad(x.transpose(1, 2), (3, 0)), conv.weight.unsqueeze(1), groups=6)).transpose(1, 2)
    assert rel_error(y, ref) < 1e-14


@pytest.mark.parametrize("options, message", [
    (dict(hidden_size=30, num_heads=4), "not divisible into num_heads"),
    (dict(hidden_size=32, num_heads=4, num_kv_heads=3), "num_kv_heads"),
    (dict(hidden_size=32, num_heads=0), "at least 1"),
    (dict(hidden_size=33, num_heads=1), "whole number"),
    (dict(mode="parallel"), "mode"),
    (dict(gate_fn="relu"), "gate_fn"),
    (dict(gate_logit_normalizer=0), "gate_logit_normalizer"),
    (dict(clamp_min=0.5), "clamp_min"),
    (dict(gate_low_rank_dim=0), "gate_low_rank_dim"),
    (dict(use_short_conv=True, conv_size=0), "conv_size"),
    (dict(norm_eps=0.0), "norm_eps"),
])
def test_bad_configurations_raise_value_errors(options, message):
    options = {"hidden_size": 32, "num_heads": 2, **options}
    with pytest.raises(ValueError, match=message):
        GatedLinearAttention(**options)


def test_bad_inputs_raise_value_errors():
    layer = GatedLinearAttention(hidden_size=32, num_heads=2)
    with pytest.raises(ValueError, match="hidden_states"):
        layer(torch.randn(2, 5, 16))
    with pytest.raises(ValueError, match="attention_mask"):
        layer(torch.randn(2, 5, 32), attention_mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match="cu_seqlens"):
        layer(torch.randn(2, 5, 32), cu_seqlens=torch.tensor([0, 5], dtype=torch.int32))
