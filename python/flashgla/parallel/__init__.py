"""The GLA model across GPUs (torch.distributed): FSDP2 (`parallelize`), DCP checkpoints, and the
layer pieces of context parallelism (conv halo, K/V all-gather, the loss over a CP group).
Re-exported by flashgla.distributed, next to the CP context and ops."""

from .checkpoint import load_checkpoint, load_model, save_checkpoint
from .fsdp import apply_activation_checkpointing, fsdp_mesh, init_mesh, parallelize
from .layers import conv_with_halo, cp_mean_loss, exchange_halo, gather_keys_values, local_slice, shift_labels
