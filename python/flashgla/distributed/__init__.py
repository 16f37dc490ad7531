"""flashgla across GPUs (torch.distributed): FSDP2 for the GLA LM, DCP checkpoints."""

from .checkpoint import load_checkpoint, load_model, save_checkpoint
from .parallel import apply_activation_checkpointing, fsdp_mesh, init_mesh, parallelize
