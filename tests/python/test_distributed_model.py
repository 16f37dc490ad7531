"""The GLA LM across processes on the CPU (gloo): FSDP2 training equals one process, DCP checkpoints
written by 2 ranks load on 1 rank and into the plain model; the chunked LM cross-entropy equals the
materialised one. Multi-process tests run under a hard timeout (spawn_utils.run_distributed)."""

import copy

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
    from flashgla.distributed import parallelize, save_checkpoint

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
    from flashgla.distributed import load_checkpoint, parallelize

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


@requires_dist
@pytest.mark.parametrize("options", [
    dict(),
    dict(activation_checkpointing=True, loss_chunk_size=7, reshard_after_forward=False, prefetch=False),
], ids=["default", "checkpointing-chunked-loss"])
def test_fsdp2_training_equals_one_process(options):
    run_distributed(_fsdp_worker, 2, _config(), 1234, options, None, timeout=180)


@requires_dist
def test_fsdp2_with_tied_embeddings_equals_one_process():
    run_distributed(_fsdp_worker, 2, _config(tie_word_embeddings=True), 99, {}, None, timeout=180)


@requires_dist
def test_dcp_checkpoint_of_two_ranks_loads_on_one_rank_and_into_the_plain_model(tmp_path):
    from flashgla.distributed import load_model

    config, seed, directory = _config(attn_layers=[1]), 7, str(tmp_path / "ckpt")
    run_distributed(_fsdp_worker, 2, config, seed, {}, directory, timeout=180)
    run_distributed(_load_worker, 1, config, seed, directory, timeout=120)
    model = load_model(directory, dtype=torch.float64)
    expected = _reference_parameters(config, seed, 2)
    for name, p in model.named_parameters():
        assert_close(p, expected[name], 1e-9, f"plain model {name}")
