"""Checkpoints of a (sharded) GLA LM through torch.distributed.checkpoint (DCP).

`save_checkpoint` writes the model (and optionally the optimizer and extra values) from every rank
of an FSDP2 model; the files hold full tensors' shards with the plain model's parameter names, so
`load_checkpoint` reads them back on any number of ranks (a different sharding) and
`load_model` into an ordinary single-process GLAForCausalLM.
"""

import contextlib
import os
import warnings
from typing import Optional

import torch
from torch import nn

__all__ = ["save_checkpoint", "load_checkpoint", "load_model"]

CONFIG_FILE = "config.json"


def _dcp():
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                         get_optimizer_state_dict, set_model_state_dict,
                                                         set_optimizer_state_dict)

    return dcp, StateDictOptions, get_model_state_dict, get_optimizer_state_dict, set_model_state_dict, \
        set_optimizer_state_dict


@contextlib.contextmanager
def _quiet():
    """DCP's notices about what was asked for: overwriting the run's own checkpoint, one process."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Detected an existing checkpoint")
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def save_checkpoint(directory: str, model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
                    extra: Optional[dict] = None) -> None:
    """Called on every rank. Writes `directory` (DCP files) and, from rank 0, config.json."""
    import torch.distributed as dist

    dcp, _, get_model_state_dict, get_optimizer_state_dict, _, _ = _dcp()
    state = {"model": get_model_state_dict(model)}
    if optimizer is not None:
        state["optimizer"] = get_optimizer_state_dict(model, optimizer)
    if extra:
        state["extra"] = extra
    os.makedirs(directory, exist_ok=True)
    try:  # a training run rewrites its checkpoint directory (torch warns unless told so)
        writer = dcp.FileSystemWriter(directory, overwrite=True)
    except TypeError:  # torch < 2.5: always overwrites
        writer = dcp.FileSystemWriter(directory)
    with _quiet():
        dcp.save(state, storage_writer=writer)
    if (not dist.is_initialized() or dist.get_rank() == 0) and hasattr(model, "config"):
        model.config.to_json(os.path.join(directory, CONFIG_FILE))
    if dist.is_initialized():
        dist.barrier()


def load_checkpoint(directory: str, model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
                    extra: Optional[dict] = None) -> Optional[dict]:
    """Called on every rank, after the model (and optimizer) are built and sharded like for training.
    `extra`: a dict with the same keys as saved (its values are overwritten); returned."""
    dcp, StateDictOptions, get_model_state_dict, get_optimizer_state_dict, set_model_state_dict, \
        set_optimizer_state_dict = _dcp()
    state = {"model": get_model_state_dict(model)}
    if optimizer is not None:
        state["optimizer"] = get_optimizer_state_dict(model, optimizer)
    if extra is not None:
        state["extra"] = extra
    with _quiet():
        dcp.load(state, checkpoint_id=directory)
    set_model_state_dict(model, state["model"])
    if optimizer is not None:
        set_optimizer_state_dict(model, optimizer, state["optimizer"])
    return state.get("extra")


def load_model(directory: str, map_location="cpu", dtype: Optional[torch.dtype] = None):
    """A plain GLAForCausalLM from a DCP checkpoint (one process, no process group needed), its
    parameters in `dtype` (default: the model's, fp32), read from the checkpoint's values."""
    import torch.distributed.checkpoint as dcp

    from ..models import GLAConfig, GLAForCausalLM

    config = GLAConfig.from_json(os.path.join(directory, CONFIG_FILE))
    model = GLAForCausalLM(config)
    if dtype is not None:
        model = model.to(dtype)
    state = {"model": model.state_dict()}
    with _quiet():
        dcp.load(state, checkpoint_id=directory, no_dist=True)
    model.load_state_dict(state["model"])
    return model.to(map_location)
