"""FSDP2 for the GLA language model: `parallelize(model, mesh)`.

Parameters are sharded with torch's `fully_shard` over the flattened ("dp_shard", "cp") mesh
(torchtitan's names: every rank of a context-parallel group holds a shard too), one FSDP unit per
block, the token embedding as a unit of its own and the final norm + LM head in the root.

What decides the weak-scaling efficiency (the layout and policies below, and why):

- Explicit prefetch. FSDP2 by default issues a block's all-gather only when the CPU reaches that
  block's forward; whenever the CPU is not far ahead of the GPU (a host sync, or Python overhead of
  many small ops) the all-gather is exposed. Each unit names the next one to prefetch in forward and
  the previous one in backward, so one all-gather is always in flight behind the compute.
- No reshard after forward for the last block (its parameters are gathered again right away for the
  backward) nor for the embedding (a second all-gather in backward for a weight the embedding's
  backward never reads).
- The embedding separate from the root: the root's reduce-scatter runs after the whole backward,
  exposed; with the embedding (and, untied, the head) split out, that exposed tail is smaller and
  the head's gradient reduction overlaps the blocks' backward.
- fp32 gradient reduction is what the issue asks for (`reduce_dtype`); it doubles the
  reduce-scatter bytes against bf16 but overlaps with the backward of the preceding block.

Gradients under context parallelism: the model's loss on each rank is its share of the mean over
the whole CP group (the sum of its tokens' losses over the all-reduced token count), so the
gradient of the group's loss is the *sum* over the CP ranks; FSDP's reduction therefore divides by
the data-parallel size only, not by dp_shard * cp.
"""

from typing import Optional

import torch
from torch import nn

__all__ = ["parallelize", "fsdp_mesh", "init_mesh", "apply_activation_checkpointing", "compile_blocks"]


def _fsdp_api():
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError as error:  # torch < 2.6 keeps FSDP2 under _composable
        try:
            from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard
        except ImportError:
            raise NotImplementedError("flashgla: parallelize needs torch's FSDP2 (fully_shard, torch >= 2.4)") from error
    return fully_shard, MixedPrecisionPolicy


def init_mesh(device_type: str, dp_shard: int = -1, cp: int = 1):
    """A DeviceMesh ("dp_shard", "cp") over all ranks; dp_shard = -1 takes what cp leaves."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    if cp < 1 or world % cp:
        raise ValueError(f"flashgla: cp: expected a divisor of the world size {world}, got {cp}")
    if dp_shard == -1:
        dp_shard = world // cp
    if dp_shard * cp != world:
        raise ValueError(f"flashgla: dp_shard: dp_shard * cp must equal the world size {world}, got {dp_shard} * {cp}")
    return init_device_mesh(device_type, (dp_shard, cp), mesh_dim_names=("dp_shard", "cp"))


def fsdp_mesh(mesh):
    """The 1-D mesh FSDP shards over: the mesh itself when 1-D, else its ("dp_shard", "cp") dims flattened."""
    if mesh.ndim == 1:
        return mesh
    names = tuple(mesh.mesh_dim_names or ())
    if names != ("dp_shard", "cp"):
        raise ValueError(f"flashgla: mesh: expected a 1-D mesh or dims ('dp_shard', 'cp'), got {names}")
    return mesh["dp_shard", "cp"]._flatten("dp_shard_cp")


def apply_activation_checkpointing(module: nn.Module) -> None:
    """Recompute `module`'s forward in the backward (non-reentrant torch.utils.checkpoint).

    The module keeps its parameter names (no wrapper module, so checkpoints stay interchangeable with
    the plain model); its forward hooks (FSDP's) still run on the outer call. Every rank must use
    the same policy: a context-parallel block repeats its collectives in the recomputation.
    """
    from torch.utils.checkpoint import checkpoint

    forward = module.forward

    def checkpointed(*args, **kwargs):
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    module.forward = checkpointed


def compile_blocks(model: nn.Module) -> nn.Module:
    """torch.compile each block's forward in place (the model's blocks, `model.layers`) and return the model.

    An eager GLA block launches about a hundred kernels per step, each through Python and torch's
    dispatcher; at 16K tokens per GPU the 340M model's host work then exceeds its GPU work, and every
    hook FSDP adds per block lengthens the step. Compiled, a block's forward and backward are one graph
    each (the flashgla ops opaque inside them, the element-wise work around them fused), so the host
    runs ahead of the GPU. The forward is compiled rather than the module: the module's hooks (FSDP's)
    stay eager, and the parameter names stay those of the plain model. All blocks share one graph (the
    same code and shapes). Apply after apply_activation_checkpointing, before fully_shard (parallelize
    does, with compile=True).
    """
    for block in model.layers:
        block.forward = torch.compile(block.forward)
    return model


def parallelize(model: nn.Module, mesh=None, *, param_dtype: Optional[torch.dtype] = torch.bfloat16,
                reduce_dtype: Optional[torch.dtype] = torch.float32, activation_checkpointing: bool = False,
                loss_chunk_size: Optional[int] = None, reshard_after_forward: bool = True,
                prefetch: bool = True, compile: bool = False, blocks_per_unit: int = 4) -> nn.Module:
    """Shards a GLAForCausalLM in place with FSDP2 and returns it.

    mesh: a 1-D DeviceMesh, or ("dp_shard", "cp") from init_mesh (FSDP over both); None: all ranks
    of the default group on the model's device type. param_dtype / reduce_dtype: the
    MixedPrecisionPolicy (None keeps the parameters' dtype). activation_checkpointing: recompute each
    block in the backward. loss_chunk_size: tokens per chunk of the LM head + cross-entropy (the
    logits are then never materialised). reshard_after_forward: free the blocks' gathered
    parameters after their forward (False: ZeRO-2-like, more memory, half the all-gathers).
    prefetch: explicit one-ahead prefetch in forward and backward. compile: compile_blocks first.
    blocks_per_unit: consecutive blocks sharded together as one FSDP unit (one all-gather and one
    reduce-scatter for all of them; fewer hooks per step, more memory in flight). 4: the 340M LM on two
    H200s with compiled blocks kept 99% of one GPU's tokens/s per GPU at 32K tokens per GPU, against 92%
    with one block per unit (bench/results_multi_gpu.md).
    """
    import torch.distributed as dist

    fully_shard, MixedPrecisionPolicy = _fsdp_api()
    for name in ("embeddings", "layers", "norm", "lm_head"):
        if not hasattr(model, name):
            raise TypeError(f"flashgla: model: expected a GLAForCausalLM (with .{name}), got {type(model).__name__}")
    if not isinstance(blocks_per_unit, int) or blocks_per_unit < 1:
        raise ValueError(f"flashgla: blocks_per_unit: expected an integer of at least 1, got {blocks_per_unit!r}")
    if loss_chunk_size is not None and loss_chunk_size < 1:
        raise ValueError(f"flashgla: loss_chunk_size: expected at least 1 or None, got {loss_chunk_size}")
    if mesh is None:
        from torch.distributed.device_mesh import init_device_mesh

        device_type = next(model.parameters()).device.type
        mesh = init_device_mesh(device_type, (dist.get_world_size(),), mesh_dim_names=("dp_shard",))
    cp_size = mesh["cp"].size() if mesh.ndim > 1 else 1
    shard_mesh = fsdp_mesh(mesh)

    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    blocks = list(model.layers)
    if activation_checkpointing:
        for block in blocks:
            apply_activation_checkpointing(block)
    if compile:
        compile_blocks(model)
    units = []
    tied = model.lm_head.weight is model.embeddings.weight
    if not tied:  # a tied weight must live in one unit: then the root holds the embedding and the head
        fully_shard(model.embeddings, mesh=shard_mesh, mp_policy=policy, reshard_after_forward=False)
        units.append(model.embeddings)
    groups = [blocks[i:i + blocks_per_unit] for i in range(0, len(blocks), blocks_per_unit)]
    for i, group in enumerate(groups):
        last = i == len(groups) - 1
        fully_shard(group if len(group) > 1 else group[0], mesh=shard_mesh, mp_policy=policy,
                    reshard_after_forward=reshard_after_forward and not last)
        units.append(group[0])  # a group's modules share one FSDP state: the first names the unit
    fully_shard(model, mesh=shard_mesh, mp_policy=policy)
    if prefetch:
        # The root's pre-forward queues the first two units' all-gathers right behind its own.
        model.set_modules_to_forward_prefetch(units[:2])
        for earlier, later in zip(units, units[1:]):
            earlier.set_modules_to_forward_prefetch([later])
            later.set_modules_to_backward_prefetch([earlier])
    if cp_size > 1:
        factor = float(shard_mesh.size() // cp_size)
        # NCCL applies a custom factor as PreMulSum, which gloo lacks: there, plain sums plus a scaling.
        gloo = "gloo" in str(dist.get_backend(shard_mesh.get_group())).lower()
        for module in [model, *units]:
            setter = getattr(module, "set_gradient_divide_factor", None) or module.set_reduce_scatter_divide_factor
            setter(factor)
            if gloo and hasattr(module, "set_force_sum_reduction_for_comms"):
                module.set_force_sum_reduction_for_comms(True)
    model.loss_chunk_size = loss_chunk_size
    return model
