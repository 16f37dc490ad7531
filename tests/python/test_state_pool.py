"""fused_recurrent_gla / fused_recurrent_simple_gla with vLLM's state-pool arguments (ssm_state_indices,
num_accepted_tokens, inplace_final_state; FLA 0.6's fused_recurrent_kda_fwd defines them): every sequence must
give what it gives alone, pool rows outside the call must stay as they were, and bad indices must be refused
with an error naming the argument."""

import re

import pytest
import torch

import flashgla
from testing_utils import TOLERANCE, assert_close, cu, gla_inputs, poisoned_outputs, requires_gpu, sequences

DEVICES = ["cpu", pytest.param("cuda", marks=requires_gpu)]
GATES = ["vector", "scalar", "gamma", None]


def raises(kind, argument, *fragments):
    pattern = rf"^flashgla: {re.escape(argument)}: " + "".join(rf"(?=.*{re.escape(f)})" for f in fragments)
    return pytest.raises(kind, match=pattern)


def call(gate, q, k, v, g, **kwargs):
    """The op for a gate kind: fused_recurrent_gla (per-key gate), else fused_recurrent_simple_gla (scalar gate,
    g_gamma with it, or no gate)."""
    if gate == "vector":
        return flashgla.fused_recurrent_gla(q, k, v, gk=g, **kwargs)
    gamma = -torch.linspace(0.05, 0.5, q.shape[2], dtype=torch.float32, device=q.device) if gate == "gamma" else None
    return flashgla.fused_recurrent_simple_gla(q, k, v, g=g, g_gamma=gamma, **kwargs)


def inputs(gen, gate, lengths, H=2, K=16, V=8, dtype=torch.float32, device="cpu", varlen=True):
    """q, k, v, g and cu_seqlens for sequences of the given lengths: packed (B = 1, cu_seqlens), or a fixed-length
    batch when every length is the same and varlen is False."""
    if varlen:
        cu_seqlens = cu(lengths)
        q, k, v, g, _ = gla_inputs(gen, 1, sum(lengths), H, K, V, gate="vector" if gate == "vector" else
                                   ("scalar" if gate in ("scalar", "gamma") else None), dtype=dtype)
    else:
        cu_seqlens = None
        q, k, v, g, _ = gla_inputs(gen, len(lengths), lengths[0], H, K, V, gate="vector" if gate == "vector" else
                                   ("scalar" if gate in ("scalar", "gamma") else None), dtype=dtype)
    return tuple(None if t is None else t.to(device) for t in (q, k, v, g, cu_seqlens))


def one_sequence(x, span):
    b, begin, end = span
    return None if x is None else x[b:b + 1, begin:end]


def alone(gate, q, k, v, g, h0, span, tokens=None, state_v_first=False):
    """Sequence `span` run alone (its first `tokens` tokens) from h0 [H, K, V]: (o, final state)."""
    b, begin, end = span
    if tokens is not None:
        end = begin + tokens
    part = [one_sequence(x, (b, begin, end)) for x in (q, k, v, g)]
    o, ht = call(gate, *part, initial_state=h0[None].clone(), output_final_state=True, state_v_first=state_v_first)
    return o[0], ht[0]


def expect_equal(out, ref, name, device):
    """Bitwise on the CPU (the same fp64 recurrence runs token by token either way); on CUDA the same kernel."""
    if device == "cpu":
        assert torch.equal(out, ref), f"{name}: differs from the sequence run alone"
    else:
        assert_close(out, ref, TOLERANCE[torch.float32], name)


def pool_of(gen, P, H, K, V, device, state_v_first=False):
    shape = (P, H, V, K) if state_v_first else (P, H, K, V)
    return torch.randn(*shape, generator=gen).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gate", GATES, ids=str)
@pytest.mark.parametrize("varlen", [True, False], ids=["varlen", "fixed"])
def test_rows_per_sequence(gen, device, gate, varlen):
    """ssm_state_indices [N]: start from the row, final state back to it (prefill or one decode token)."""
    lengths = [3, 0, 5, 1, 2] if varlen else [4, 4, 4, 4, 4]
    H, K, V = 2, 16, 8
    q, k, v, g, cu_seqlens = inputs(gen, gate, lengths, H, K, V, device=device, varlen=varlen)
    rows = torch.tensor([6, 2, -1, 0, 4], dtype=torch.int32, device=device)  # sequence 2: a padded slot
    pool0 = pool_of(gen, 8, H, K, V, device)
    pool = pool0.clone()
    with poisoned_outputs():
        o, ht = call(gate, q, k, v, g, initial_state=pool, ssm_state_indices=rows, cu_seqlens=cu_seqlens,
                     output_final_state=True)
    assert ht is pool, "inplace_final_state (the default) returns the pool"
    T = q.shape[1]
    written = set()
    for n, span in enumerate(sequences(q.shape[0], T, cu_seqlens)):
        b, begin, end = span
        row = int(rows[n])
        if row < 0:
            assert torch.equal(o[b, begin:end], torch.zeros_like(o[b, begin:end])), f"padded slot {n}: o not zero"
            continue
        o_ref, ht_ref = alone(gate, q, k, v, g, pool0[row], span)
        expect_equal(o[b, begin:end], o_ref, f"o of sequence {n}", device)
        if end > begin:
            expect_equal(pool[row], ht_ref, f"pool row {row} (sequence {n})", device)
            written.add(row)
    for row in range(pool.shape[0]):
        if row not in written:
            assert torch.equal(pool[row], pool0[row]), f"pool row {row}: written, though no sequence ends there"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gate", GATES, ids=str)
@pytest.mark.parametrize("state_v_first", [False, True], ids=["kv", "v_first"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("T", [1, 3])
def test_decode_steps_in_place(gen, device, gate, state_v_first, dtype, T):
    """The serving step: a fixed-length batch of T tokens per sequence, ssm_state_indices [N], the pool written in
    place (on CUDA the decode kernel runs it); each sequence as it runs alone, the other rows untouched."""
    H, K, V = 2, 32, 16
    q, k, v, g, _ = inputs(gen, gate, [T] * 4, H, K, V, dtype=dtype, device=device, varlen=False)
    rows = torch.tensor([3, -1, 0, 5], dtype=torch.int32, device=device)  # sequence 1: a padded slot
    pool0 = pool_of(gen, 7, H, K, V, device, state_v_first)
    pool = pool0.clone()
    with poisoned_outputs():
        o, ht = call(gate, q, k, v, g, initial_state=pool, ssm_state_indices=rows, output_final_state=True,
                     state_v_first=state_v_first)
    assert ht is pool
    for n in range(4):
        row = int(rows[n])
        if row < 0:
            assert torch.equal(o[n], torch.zeros_like(o[n])), f"padded slot {n}: o not zero"
            continue
        o_ref, ht_ref = alone(gate, q, k, v, g, pool0[row], (n, 0, T), state_v_first=state_v_first)
        if device == "cpu":
            expect_equal(o[n], o_ref, f"o of sequence {n}", device)
        else:
            assert_close(o[n], o_ref, TOLERANCE[dtype], f"o of sequence {n}")
        expect_equal(pool[row], ht_ref, f"pool row {row} (sequence {n})", device)
    for row in (1, 2, 4, 6):
        assert torch.equal(pool[row], pool0[row]), f"pool row {row}: written, though no sequence maps to it"


def speculative_case(gen, gate, device, state_v_first=False):
    """Three sequences of up to T_max = 4 draft tokens each (varlen), a pool row per draft token, and the
    number of tokens accepted in the previous step; the last sequence is a padded slot."""
    H, K, V = 2, 16, 8
    lengths = [3, 1, 4, 2]
    q, k, v, g, cu_seqlens = inputs(gen, gate, lengths, H, K, V, device=device)
    rows = torch.tensor([[0, 5, 9, -1], [3, 1, -1, -1], [7, 8, 2, 10], [-1, -1, -1, -1]], dtype=torch.int32,
                        device=device)
    accepted = torch.tensor([2, 1, 4, 1], dtype=torch.int32, device=device)
    pool0 = pool_of(gen, 12, H, K, V, device, state_v_first)
    return q, k, v, g, cu_seqlens, rows, accepted, pool0


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gate", GATES, ids=str)
@pytest.mark.parametrize("state_v_first", [False, True], ids=["kv", "v_first"])
def test_speculative_decoding_in_place(gen, device, gate, state_v_first):
    """ssm_state_indices [N, T_max] with num_accepted_tokens: start from row [n, a - 1], the state after
    token t goes to row [n, t]."""
    q, k, v, g, cu_seqlens, rows, accepted, pool0 = speculative_case(gen, gate, device, state_v_first)
    pool = pool0.clone()
    with poisoned_outputs():
        o, ht = call(gate, q, k, v, g, initial_state=pool, ssm_state_indices=rows, num_accepted_tokens=accepted,
                     cu_seqlens=cu_seqlens, state_v_first=state_v_first, inplace_final_state=True)
    assert ht is pool
    written = set()
    for n, span in enumerate(sequences(1, q.shape[1], cu_seqlens)):
        b, begin, end = span
        start = int(rows[n, int(accepted[n]) - 1])
        if start < 0:
            assert torch.equal(o[b, begin:end], torch.zeros_like(o[b, begin:end])), f"padded slot {n}: o not zero"
            continue
        o_ref, _ = alone(gate, q, k, v, g, pool0[start], span, state_v_first=state_v_first)
        expect_equal(o[b, begin:end], o_ref, f"o of sequence {n}", device)
        for t in range(end - begin):
            row = int(rows[n, t])
            if row >= 0:
                _, state = alone(gate, q, k, v, g, pool0[start], span, tokens=t + 1, state_v_first=state_v_first)
                expect_equal(pool[row], state, f"pool row {row} (sequence {n} after token {t})", device)
                written.add(row)
    for row in range(pool.shape[0]):
        if row not in written:
            assert torch.equal(pool[row], pool0[row]), f"pool row {row}: written, though no token maps to it"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gate", ["vector", "scalar"], ids=str)
def test_more_tokens_than_rows(gen, device, gate):
    """A sequence longer than T_max runs on past its last row: its later states go nowhere, its outputs are
    those of the sequence run alone."""
    H, K, V = 2, 16, 8
    q, k, v, g, cu_seqlens = inputs(gen, gate, [6, 2], H, K, V, device=device)
    rows = torch.tensor([[4, 1, 3], [0, 2, -1]], dtype=torch.int32, device=device)
    accepted = torch.tensor([3, 1], dtype=torch.int32, device=device)
    pool0 = pool_of(gen, 6, H, K, V, device)
    pool = pool0.clone()
    o, _ = call(gate, q, k, v, g, initial_state=pool, ssm_state_indices=rows, num_accepted_tokens=accepted,
                cu_seqlens=cu_seqlens)
    starts = [3, 0]
    for n, span in enumerate(sequences(1, q.shape[1], cu_seqlens)):
        _, begin, end = span
        o_ref, _ = alone(gate, q, k, v, g, pool0[starts[n]], span)
        expect_equal(o[0, begin:end], o_ref, f"o of sequence {n}", device)
        for t in range(min(end - begin, 3)):
            row = int(rows[n, t])
            if row >= 0:
                _, state = alone(gate, q, k, v, g, pool0[starts[n]], span, tokens=t + 1)
                expect_equal(pool[row], state, f"pool row {row} (sequence {n} after token {t})", device)
    assert torch.equal(pool[5], pool0[5]), "pool row 5: written, though no token maps to it"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("gate", ["vector", "gamma"], ids=str)
def test_token_states_out_of_place(gen, device, gate):
    """inplace_final_state=False: the pool is only read; the state after every token comes back [B*T, H, K, V]."""
    q, k, v, g, cu_seqlens, rows, accepted, pool0 = speculative_case(gen, gate, device)
    pool = pool0.clone()
    o, states = call(gate, q, k, v, g, initial_state=pool, ssm_state_indices=rows, num_accepted_tokens=accepted,
                     cu_seqlens=cu_seqlens, output_final_state=True, inplace_final_state=False)
    assert torch.equal(pool, pool0), "the pool was written without inplace_final_state"
    H, K, V = pool.shape[1:]
    assert states.shape == (q.shape[1], H, K, V) and states.dtype == torch.float32
    for n, span in enumerate(sequences(1, q.shape[1], cu_seqlens)):
        _, begin, end = span
        start = int(rows[n, int(accepted[n]) - 1])
        if start < 0:
            assert torch.equal(states[begin:end], torch.zeros_like(states[begin:end])), f"padded slot {n}: states"
            continue
        for t in range(end - begin):
            _, state = alone(gate, q, k, v, g, pool0[start], span, tokens=t + 1)
            expect_equal(states[begin + t], state, f"state of sequence {n} after token {t}", device)
    o2, none = call(gate, q, k, v, g, initial_state=pool, ssm_state_indices=rows, num_accepted_tokens=accepted,
                    cu_seqlens=cu_seqlens, inplace_final_state=False)
    assert none is None and torch.equal(o2, o)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_inputs(gen, dtype):
    """16-bit q, k, v: the pool path rounds o as the plain path does."""
    lengths = [2, 3]
    q, k, v, g, cu_seqlens = inputs(gen, "vector", lengths, dtype=dtype)
    rows = torch.tensor([1, 0], dtype=torch.int32)
    pool0 = pool_of(gen, 2, 2, 16, 8, "cpu")
    pool = pool0.clone()
    o, _ = call("vector", q, k, v, g, initial_state=pool, ssm_state_indices=rows, cu_seqlens=cu_seqlens)
    for n, span in enumerate(sequences(1, q.shape[1], cu_seqlens)):
        o_ref, ht_ref = alone("vector", q, k, v, g, pool0[int(rows[n])], span)
        assert torch.equal(o[0, span[1]:span[2]], o_ref) and torch.equal(pool[int(rows[n])], ht_ref)


# ---- bad arguments ----------------------------------------------------------------------------------------

def small_case(gen):
    q, k, v, g, cu_seqlens = inputs(gen, "vector", [2, 1, 3])
    return q, k, v, g, cu_seqlens, pool_of(gen, 5, 2, 16, 8, "cpu")


def test_bad_indices(gen):
    q, k, v, g, cu_seqlens, pool = small_case(gen)

    def run(**kwargs):
        return flashgla.fused_recurrent_gla(q, k, v, g, initial_state=pool, cu_seqlens=cu_seqlens, **kwargs)

    def i32(rows):
        return torch.tensor(rows, dtype=torch.int32)

    before = pool.clone()
    with raises(ValueError, "ssm_state_indices", "< P = 5", "got 5 at [1]"):
        run(ssm_state_indices=i32([0, 5, 1]))
    with raises(ValueError, "ssm_state_indices", "distinct", "row 1 twice"):
        run(ssm_state_indices=i32([1, 3, 1]))
    with raises(ValueError, "ssm_state_indices", "distinct", "row 3 twice", "[1, 0]"):
        run(ssm_state_indices=i32([[0, 3], [3, -1], [2, 4]]))
    with raises(ValueError, "ssm_state_indices", "< P = 5", "at [2, 1]"):
        run(ssm_state_indices=i32([[0, 1], [3, -1], [2, 7]]))
    with raises(TypeError, "ssm_state_indices", "int32"):
        run(ssm_state_indices=torch.tensor([0, 1, 2]))  # int64
    with raises(TypeError, "ssm_state_indices"):
        run(ssm_state_indices=torch.tensor([0.0, 1.0, 2.0]))
    with raises(ValueError, "ssm_state_indices", "[N]"):
        run(ssm_state_indices=i32([0, 1]))  # N = 3 sequences
    with raises(ValueError, "ssm_state_indices", "[N] or [N, T_max]"):
        run(ssm_state_indices=i32([[[0]], [[1]], [[2]]]))
    with raises(ValueError, "num_accepted_tokens", "1 to T_max = 2", "got 3 at position 1"):
        run(ssm_state_indices=i32([[0, 1], [2, 3], [4, -1]]), num_accepted_tokens=i32([1, 3, 1]))
    with raises(ValueError, "num_accepted_tokens", "1 to T_max = 2", "got 0 at position 0"):
        run(ssm_state_indices=i32([[0, 1], [2, 3], [4, -1]]), num_accepted_tokens=i32([0, 1, 1]))
    with raises(ValueError, "num_accepted_tokens", "[N, T_max]"):
        run(ssm_state_indices=i32([0, 1, 2]), num_accepted_tokens=i32([1, 1, 1]))
    with raises(ValueError, "num_accepted_tokens", "[N]"):
        run(ssm_state_indices=i32([[0, 1], [2, 3], [4, -1]]), num_accepted_tokens=i32([1, 1]))
    with raises(TypeError, "num_accepted_tokens", "int32"):
        run(ssm_state_indices=i32([[0, 1], [2, 3], [4, -1]]), num_accepted_tokens=torch.tensor([1, 1, 1]))
    assert torch.equal(pool, before), "a refused call wrote the pool"


def test_bad_combinations(gen):
    q, k, v, g, cu_seqlens, pool = small_case(gen)
    rows = torch.tensor([0, 1, 2], dtype=torch.int32)
    with raises(ValueError, "num_accepted_tokens", "ssm_state_indices"):
        flashgla.fused_recurrent_gla(q, k, v, g, initial_state=pool[:3], cu_seqlens=cu_seqlens,
                                     num_accepted_tokens=rows)
    with raises(ValueError, "inplace_final_state", "ssm_state_indices"):
        flashgla.fused_recurrent_simple_gla(q, k, v, initial_state=pool[:3], cu_seqlens=cu_seqlens,
                                            inplace_final_state=True)
    with raises(ValueError, "initial_state", "pool"):
        flashgla.fused_recurrent_gla(q, k, v, g, cu_seqlens=cu_seqlens, ssm_state_indices=rows)
    with raises(ValueError, "initial_state", "[P, H, K, V]"):
        flashgla.fused_recurrent_gla(q, k, v, g, initial_state=pool[:, :, :8], cu_seqlens=cu_seqlens,
                                     ssm_state_indices=rows)
    with raises(TypeError, "initial_state", "float32"):
        flashgla.fused_recurrent_gla(q, k, v, g, initial_state=pool.double(), cu_seqlens=cu_seqlens,
                                     ssm_state_indices=rows)
    with raises(ValueError, "reverse", "ssm_state_indices"):
        flashgla.fused_recurrent_gla(q, k, v, g, initial_state=pool, cu_seqlens=cu_seqlens, ssm_state_indices=rows,
                                     reverse=True)
    with raises(TypeError, "inplace_final_state", "bool"):
        flashgla.fused_recurrent_gla(q, k, v, g, initial_state=pool, cu_seqlens=cu_seqlens, ssm_state_indices=rows,
                                     inplace_final_state=rows)
    with raises(TypeError, "inplace_final_state", "bool"):
        flashgla.fused_recurrent_gla(q, k, v, g, initial_state=pool[:3], cu_seqlens=cu_seqlens,
                                     inplace_final_state=rows)
    with raises(NotImplementedError, "ssm_state_indices", "inference"):
        flashgla.fused_recurrent_gla(q.requires_grad_(), k, v, g, initial_state=pool, cu_seqlens=cu_seqlens,
                                     ssm_state_indices=rows)


@requires_gpu
def test_indices_on_another_device(gen):
    q, k, v, g, cu_seqlens, pool = small_case(gen)
    q, k, v, g, cu_seqlens, pool = (t.cuda() for t in (q, k, v, g, cu_seqlens, pool))
    with raises(ValueError, "ssm_state_indices", "device"):
        flashgla.fused_recurrent_gla(q, k, v, g, initial_state=pool, cu_seqlens=cu_seqlens,
                                     ssm_state_indices=torch.tensor([0, 1, 2], dtype=torch.int32))
    with raises(ValueError, "num_accepted_tokens", "device"):
        flashgla.fused_recurrent_gla(q, k, v, g, initial_state=pool, cu_seqlens=cu_seqlens,
                                     ssm_state_indices=torch.tensor([[0, 1], [2, 3], [4, -1]], dtype=torch.int32,
                                                                    device="cuda"),
                                     num_accepted_tokens=torch.ones(3, dtype=torch.int32))


@pytest.mark.parametrize("inplace", [True, False], ids=["inplace", "token_states"])
def test_opcheck(gen, inplace):
    """The op's schema (the pool is mutated), its fake implementation and its dispatch (torch.compile)."""
    q, k, v, g, cu_seqlens, rows, accepted, pool = speculative_case(gen, "vector", "cpu")
    torch.library.opcheck(torch.ops.flashgla.gla_recurrent_pooled.default,
                          (q, k, v, g, None, pool, rows, accepted, cu_seqlens, None, None, False, False, inplace,
                           not inplace))
