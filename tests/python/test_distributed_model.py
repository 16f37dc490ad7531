"""The GLA LM across processes on the CPU (gloo): FSDP2 training equals one process, DCP checkpoints
written by 2 ranks load on 1 rank and into the plain model; the chunked LM cross-entropy equals the
materialised one. Multi-process tests run under a hard timeout (spawn_utils.run_distributed)."""

import copy
import re

import pytest
import torch
import torch.nn.functional as F

from spawn_utils import run_distributed
from testing_utils import assert_close, rel_rms_error

from flashgla.models import GLAConfig, GLAForCausalLM
from flashgla.nn.loss import chunked_lm_cross_entropy

try:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    HAVE_DIST = dist.is_available() and dist.is_gloo_available()
except ImportError:
    HAVE_DIST = False
requires_dist = pytest.mark.skipif(not HAVE_DIST, reason="torch.distributed with gloo is not available")

STEPS, LR = 3, 1e-2


# ---- chunked cross-entropy (one process) ------------------------------------------------------------------

@pytest.mark.parametrize("chunk_size", [1, 7, 64, 1000])
def test_chunked_cross_entropy_equals_the_materialised_one(gen, chunk_size):
    N, D, vocab = 50, 12, 37
    hidden = torch.randn(N, D, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(vocab, D, generator=gen, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, vocab, (N,), generator=gen)
    targets[torch.randperm(N, generator=gen)[:9]] = -100
    total, count = chunked_lm_cross_entropy(hidden, weight, targets, chunk_size)
    ref = F.cross_entropy(hidden @ weight.t(), targets, ignore_index=-100, reduction="sum")
    assert int(count) == int((targets != -100).sum())
    assert_close(total, ref, 1e-12, "loss sum")
    upstream = torch.randn((), generator=gen, dtype=torch.float64)
    grads = torch.autograd.grad(total * upstream, (hidden, weight))
    ref_grads = torch.autograd.grad(ref * upstream, (hidden, weight))
    for name, g, r in zip(("hidden", "weight"), grads, ref_grads):
        assert_close(g, r, 1e-12, f"d{name}")


def test_chunked_cross_entropy_rejects_bad_shapes():
    with pytest.raises(ValueError, match="targets"):
        chunked_lm_cross_entropy(torch.randn(4, 3), torch.randn(5, 3), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_lm_cross_entropy(torch.randn(4, 3), torch.randn(5, 3), torch.zeros(4, dtype=torch.long), 0)


@pytest.mark.parametrize("tied", [False, True])
def test_model_loss_with_chunked_head_equals_the_plain_loss(gen, tied):
    config = GLAConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_heads=2, tie_word_embeddings=tied,
                       use_short_conv=True)
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    model = GLAForCausalLM(config).double()
    chunked = copy.deepcopy(model)
    chunked.loss_chunk_size = 5
    ids = torch.randint(0, 40, (2, 19), generator=gen)
    mask = torch.ones(2, 19, dtype=torch.long)
    mask[1, :4] = 0
    for kwargs in ({}, {"attention_mask": mask}):
        out, out_chunked = model(ids, labels=ids, **kwargs), chunked(ids, labels=ids, **kwargs)
        assert out_chunked.logits is None
        assert_close(out_chunked.loss, out.loss, 1e-12, "loss")
        grads = torch.autograd.grad(out.loss, list(model.parameters()))
        grads_chunked = torch.autograd.grad(out_chunked.loss, list(chunked.parameters()))
        for (name, _), g, c in zip(model.named_parameters(), grads, grads_chunked):
            assert_close(c, g, 1e-10, name)


# ---- FSDP2 and DCP on a CPU mesh (gloo) --------------------------------------------------------------------

def _config(**overrides):
    options = dict(vocab_size=48, hidden_size=32, num_hidden_layers=2, num_heads=2, use_short_conv=True)
    options.update(overrides)
    return GLAConfig(**options)


def _batches(world_size, seed):
    """Per step: the global batch [world_size * 2, 17] of random token ids (rank r trains rows 2r, 2r+1)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 48, (2 * world_size, 17), generator=g) for _ in range(STEPS)]


def _reference_parameters(config, seed, world_size):
    """One process, the whole global batch per step: the parameters after STEPS AdamW steps."""
    torch.manual_seed(seed)
    model = GLAForCausalLM(config).double()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.1)
    for ids in _batches(world_size, seed):
        loss = model(ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _fsdp_worker(rank, world_size, config, seed, options, checkpoint_dir):
    from flashgla.parallel import parallelize, save_checkpoint

    torch.manual_seed(seed)  # the same initial weights on every rank, as the reference's
    model = GLAForCausalLM(config).double()  # fp64: the comparison is tight, not a rounding-noise budget
    parallelize(model, param_dtype=None, reduce_dtype=None, **options)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.1)
    for ids in _batches(world_size, seed):
        local = ids[2 * rank:2 * rank + 2]
        loss = model(local, labels=local).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    full = {name: (p.full_tensor() if isinstance(p, DTensor) else p).detach() for name, p in model.named_parameters()}
    expected = _reference_parameters(config, seed, world_size)
    assert set(full) == set(expected)
    for name, value in full.items():
        error = rel_rms_error(value, expected[name])
        assert error <= 1e-9, f"rank {rank}: parameter {name}: relative RMS error {error:.3g} after {STEPS} steps"
    if checkpoint_dir is not None:
        save_checkpoint(checkpoint_dir, model, optimizer, extra={"step": torch.tensor(STEPS)})


def _load_worker(rank, world_size, config, seed, checkpoint_dir):
    """A world of a different size loads the checkpoint into a freshly sharded model and optimizer."""
    from flashgla.parallel import load_checkpoint, parallelize

    torch.manual_seed(seed + 1)  # other weights: the load must overwrite them
    model = GLAForCausalLM(config).double()
    parallelize(model, param_dtype=None, reduce_dtype=None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.1)
    extra = load_checkpoint(checkpoint_dir, model, optimizer, extra={"step": torch.tensor(0)})
    assert int(extra["step"]) == STEPS
    expected = _reference_parameters(config, seed, 2)
    for name, p in model.named_parameters():
        value = p.full_tensor() if isinstance(p, DTensor) else p
        assert_close(value, expected[name], 1e-9, f"loaded {name}")
    assert all(len(s) > 0 for s in optimizer.state.values()) and len(optimizer.state) == len(expected)


def _fsdp_cases_worker(rank, world_size, cases):
    for config, seed, options in cases:
        _fsdp_worker(rank, world_size, config, seed, options, None)


@requires_dist
def test_fsdp2_training_equals_one_process():
    """Defaults; activation checkpointing + chunked loss + no reshard + no prefetch; tied embeddings;
    compiled blocks, two per FSDP unit (3 blocks: one unit of 2, one of 1). One spawn of 2 processes."""
    cases = [(_config(), 1234, {}),
             (_config(), 1234, dict(activation_checkpointing=True, loss_chunk_size=7, reshard_after_forward=False,
                                    prefetch=False)),
             (_config(tie_word_embeddings=True), 99, {}),
             (_config(num_hidden_layers=3), 5, dict(blocks_per_unit=2, compile=True))]
    run_distributed(_fsdp_cases_worker, 2, cases, timeout=300)


@pytest.mark.parametrize("options, message", [
    (dict(blocks_per_unit=0), "blocks_per_unit: expected an integer of at least 1, got 0"),
    (dict(blocks_per_unit=1.5), "blocks_per_unit: expected an integer of at least 1, got 1.5"),
    (dict(loss_chunk_size=0), "loss_chunk_size: expected at least 1 or None, got 0"),
], ids=["zero-blocks-per-unit", "fractional-blocks-per-unit", "zero-loss-chunk"])
def test_parallelize_rejects_bad_arguments_before_sharding(options, message):
    from flashgla.parallel import parallelize

    model = GLAForCausalLM(_config())
    with pytest.raises(ValueError, match=re.escape(message)):
        parallelize(model, **options)
    with pytest.raises(TypeError, match="model: expected a GLAForCausalLM"):
        parallelize(torch.nn.Linear(2, 2))
    assert not any(isinstance(p, DTensor) for p in model.parameters())


@requires_dist
def test_dcp_checkpoint_of_two_ranks_loads_on_one_rank_and_into_the_plain_model(tmp_path):
    from flashgla.parallel import load_model

    config, seed, directory = _config(attn_layers=[1]), 7, str(tmp_path / "ckpt")
    run_distributed(_fsdp_worker, 2, config, seed, {}, directory, timeout=180)
    run_distributed(_load_worker, 1, config, seed, directory, timeout=120)
    model = load_model(directory, dtype=torch.float64)
    expected = _reference_parameters(config, seed, 2)
    for name, p in model.named_parameters():
        assert_close(p, expected[name], 1e-9, f"plain model {name}")


# ---- context parallelism: the layers and the LM against one process (gloo, fp64) --------------------------

def _all_reduce_sum(t):
    t = t.clone()
    dist.all_reduce(t)
    return t


def _halo_worker(rank, world_size, layouts, width):
    from flashgla.distributed import build_cp_context, conv_with_halo, exchange_halo, local_slice
    from flashgla.nn.conv import ShortConvolution

    for batch, bounds in layouts:
        g = torch.Generator().manual_seed(11 + len(bounds))
        total = bounds[-1]
        conv = ShortConvolution(6, width).double()
        with torch.no_grad():
            conv.weight.copy_(torch.randn(conv.weight.shape, generator=g, dtype=torch.float64))
        x = torch.randn(batch, total, 6, generator=g, dtype=torch.float64, requires_grad=True)
        dy = torch.randn(batch, total, 6, generator=g, dtype=torch.float64)
        cu = torch.tensor(bounds, dtype=torch.int32)
        ref, _ = conv(x, None, cu if batch == 1 else None)
        ref_dx, ref_dw = torch.autograd.grad((ref * dy).sum(), (x, conv.weight))

        ctx = build_cp_context(cu, conv1d_kernel_size=width)
        x_local = local_slice(x.detach(), ctx).requires_grad_()
        local_cu = ctx.cu_seqlens if batch == 1 else None
        y = conv_with_halo(conv, x_local, exchange_halo(x_local, ctx, width), local_cu)
        dx, dw = torch.autograd.grad((y * local_slice(dy, ctx)).sum(), (x_local, conv.weight))
        what = f"rank {rank}, B {batch}, cu_seqlens {bounds}"
        assert_close(y, local_slice(ref, ctx), 1e-12, f"conv output ({what})")
        assert_close(dx, local_slice(ref_dx, ctx), 1e-12, f"conv dx ({what})")
        assert_close(_all_reduce_sum(dw), ref_dw, 1e-12, f"conv dweight summed over ranks ({what})")


@requires_dist
def test_short_convolution_halo_equals_one_process():
    # 2 ranks of 12 tokens: a sequence crossing the edge with 1 row (of W-1 = 3) on the previous rank,
    # a boundary exactly at the edge, one sequence over both ranks, 1-token sequences, B = 2 rows.
    layouts = [(1, [0, 10, 11, 13, 24]), (1, [0, 12, 24]), (1, [0, 24]), (1, [0, 1, 2, 12, 13, 24]), (2, [0, 24])]
    run_distributed(_halo_worker, 2, layouts, 4, timeout=120)


def _cp_model_worker(rank, world_size, config, batch, bounds, chunk, fsdp_steps):
    from flashgla.distributed import build_cp_context, local_slice
    from flashgla.parallel import parallelize

    g = torch.Generator().manual_seed(5)
    total = bounds[-1]
    ids = torch.randint(0, config.vocab_size, (batch, total), generator=g)
    cu = torch.tensor(bounds, dtype=torch.int32)
    torch.manual_seed(17)
    reference = GLAForCausalLM(config).double()
    model = copy.deepcopy(reference)
    model.loss_chunk_size = chunk
    packed = batch == 1
    ref_loss = reference(ids, cu_seqlens=cu if packed else None, labels=ids).loss
    ref_grads = torch.autograd.grad(ref_loss, list(reference.parameters()))

    ctx = build_cp_context(cu if batch == 1 else torch.tensor([0, total], dtype=torch.int32),
                           conv1d_kernel_size=config.conv_size if config.use_short_conv else None)
    local_ids = local_labels = local_slice(ids, ctx)  # labels = input_ids, as in one process
    if fsdp_steps == 0:
        loss = model(local_ids, labels=local_labels, cp_context=ctx).loss
        assert_close(loss, ref_loss, 1e-12, f"rank {rank}: loss")
        grads = torch.autograd.grad(loss, list(model.parameters()))
        for (name, _), grad, ref in zip(model.named_parameters(), grads, ref_grads):
            assert_close(_all_reduce_sum(grad), ref, 1e-10, f"rank {rank}: d{name} summed over the CP ranks")
        return
    # FSDP2 over a ("dp_shard", "cp") = (1, world) mesh: the gradient reduction must sum over the CP
    # ranks (the loss is each rank's share of the group's mean), not average.
    from flashgla.parallel import init_mesh

    parallelize(model, init_mesh("cpu", cp=world_size), param_dtype=None, reduce_dtype=None,
                activation_checkpointing=True, loss_chunk_size=chunk)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    ref_optimizer = torch.optim.AdamW(reference.parameters(), lr=LR)
    for _ in range(fsdp_steps):
        loss = model(local_ids, labels=local_labels, cp_context=ctx).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        ref_loss = reference(ids, cu_seqlens=cu if packed else None, labels=ids).loss
        ref_optimizer.zero_grad()
        ref_loss.backward()
        ref_optimizer.step()
    for name, p in model.named_parameters():
        value = p.full_tensor() if isinstance(p, DTensor) else p
        assert_close(value, dict(reference.named_parameters())[name], 1e-9, f"rank {rank}: {name} after "
                     f"{fsdp_steps} steps")


CP_CONFIG = dict(vocab_size=40, hidden_size=32, num_hidden_layers=3, num_heads=2, use_short_conv=True)


def _cp_cases_worker(rank, world_size, cases):
    for config, batch, bounds, chunk in cases:
        _cp_model_worker(rank, world_size, config, batch, bounds, chunk, 0)


@requires_dist
def test_lm_loss_and_gradients_under_cp_equal_one_process():
    """Loss on every rank and every parameter's gradient (summed over the ranks) against one process."""
    cases = [
        # a sequence crossing the edge, a hybrid attention block
        (GLAConfig(attn_layers=[1], **CP_CONFIG), 1, [0, 7, 30, 40], None),
        # a boundary at the edge, a 1-token sequence, attention first and last, chunked loss
        (GLAConfig(attn_layers=[0, 2], **CP_CONFIG), 1, [0, 20, 21, 40], 6),
        # B = 2 rows, each one sequence over both ranks
        (GLAConfig(attn_layers=[1], **CP_CONFIG), 2, [0, 30], None),
        # B = 1, one packed sequence over both ranks (attention over keys from another rank, no boundaries)
        (GLAConfig(attn_layers=[1], **CP_CONFIG), 1, [0, 40], None),
    ]
    run_distributed(_cp_cases_worker, 2, cases, timeout=240)


@requires_dist
def test_fsdp2_with_cp_training_equals_one_process():
    config = GLAConfig(attn_layers=[1], **CP_CONFIG)
    run_distributed(_cp_model_worker, 2, config, 1, [0, 9, 33, 40], 5, STEPS, timeout=180)


def _short_rank_worker(rank, world_size):
    from flashgla.distributed import build_cp_context

    model = GLAForCausalLM(GLAConfig(**CP_CONFIG)).double()
    ctx = build_cp_context(torch.tensor([0, 4], dtype=torch.int32))  # 2 tokens per rank < W - 1 = 3
    with pytest.raises(ValueError, match=r"conv_size 4\) needs 3 rows of the previous rank"):
        model(torch.zeros(1, 2, dtype=torch.long), cp_context=ctx)
    with pytest.raises(ValueError, match="conv1d_kernel_size"):
        build_cp_context(torch.tensor([0, 4], dtype=torch.int32), conv1d_kernel_size=4)
    ctx = build_cp_context(torch.tensor([0, 16], dtype=torch.int32))
    with pytest.raises(ValueError, match="8 tokens"):
        model(torch.zeros(1, 5, dtype=torch.long), cp_context=ctx)
    with pytest.raises(ValueError, match="cp_context"):
        model(torch.zeros(1, 8, dtype=torch.long), cp_context=ctx, use_cache=True)


@requires_dist
def test_cp_model_rejects_a_rank_shorter_than_the_conv_window():
    run_distributed(_short_rank_worker, 2, timeout=120)


# ---- the training example under torchrun ------------------------------------------------------------------

def _run(command, timeout):
    import subprocess
    import sys

    env = dict(__import__("os").environ, OMP_NUM_THREADS="1")
    try:
        done = subprocess.run([sys.executable, *command], capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{command} did not finish within {timeout} s (a hang?): {e.stdout}{e.stderr}")
    assert done.returncode == 0, f"{done.stdout[-6000:]}\n{done.stderr[-6000:]}"
    return done.stdout


@requires_dist
def test_training_example_with_cp_under_torchrun_resumes_on_one_process(tmp_path):
    import os

    from flashgla.parallel import load_model

    here = os.path.dirname(os.path.abspath(__file__))
    script = os.path.join(here, "..", "..", "examples", "train_gla_lm.py")
    out = str(tmp_path / "run")
    common = ["--batch-size", "2", "--seq-len", "32", "--eval-batches", "2", "--eval-every", "2",
              "--sample-tokens", "4", "--threads", "1", "--out", out, "--use-short-conv", "--attn-layers", "1",
              "--device", "cpu"]
    text = _run(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", script, "--steps", "2",
                 "--cp", "2", "--activation-checkpointing", "--loss-chunk-size", "20", *common], timeout=240)
    assert "2 ranks = 1 data-parallel x 2 context-parallel" in text and "step 2: held-out loss" in text
    # The DCP checkpoint of 2 ranks and the full model.pt rank 0 wrote hold the same weights.
    from_dcp = load_model(os.path.join(out, "checkpoint"))
    plain = GLAForCausalLM.from_pretrained(out)
    for (name, a), b in zip(from_dcp.named_parameters(), plain.parameters()):
        assert torch.equal(a, b), name
    # One process resumes the 2-rank run from its DCP checkpoint (model, optimizer, step).
    text = _run([script, "--steps", "4", "--resume", *common], timeout=240)
    assert "step 4: held-out loss" in text and "step 2:" not in text
