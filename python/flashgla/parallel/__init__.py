"""The GLA model across GPUs (torch.distributed): FSDP2 (`parallelize`) and DCP checkpoints. Context
parallelism (the CP context, the GLA op and the layer pieces across ranks) is flashgla.distributed."""

from .checkpoint import load_checkpoint, load_model, save_checkpoint
from .fsdp import apply_activation_checkpointing, compile_blocks, fsdp_mesh, init_mesh, parallelize
