"""From torch tensors to the arguments of flashgla._C.

Mostly used inside the ops' implementations (never traced by torch.compile):
tensors become (data_ptr, dtype, device_type, device_index, shape, strides)
tuples, the CUDA stream is torch's current one, and scratch memory comes from
torch's allocator, so the C++ side never allocates or synchronises.
"""

import contextlib

import torch

from . import _C

_DTYPE_CODES = {
    torch.float64: _C.DTYPES["float64"],
    torch.float32: _C.DTYPES["float32"],
    torch.bfloat16: _C.DTYPES["bfloat16"],
    torch.float16: _C.DTYPES["float16"],
    torch.int32: _C.DTYPES["int32"],
    torch.int64: _C.DTYPES["int64"],
}


def view(t, name):
    """The tuple flashgla._C reads a tensor from; None stays None."""
    if t is None:
        return None
    code = _DTYPE_CODES.get(t.dtype)
    if code is None:
        raise TypeError(
            f"flashgla: {name}: unsupported dtype {t.dtype} "
            "(expected float64, float32, bfloat16 or float16; int32 or int64 for cu_seqlens)"
        )
    # t.shape is a torch.Size, a tuple; data_ptr() includes the storage offset.
    if t.is_cpu:
        return (t.data_ptr(), code, _C.DEVICE_CPU, 0, t.shape, t.stride())
    if t.is_cuda:
        return (t.data_ptr(), code, _C.DEVICE_CUDA, t.get_device(), t.shape, t.stride())
    raise ValueError(f"flashgla: {name}: expected a CPU or CUDA tensor, got device {t.device}")


def require_tensors(**tensors):
    """TypeError naming the first argument that is not a tensor (None stands for an optional one left out)."""
    for name, t in tensors.items():
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"flashgla: {name}: expected a torch.Tensor, got {type(t).__name__}")


def require_same_device(q, **tensors):
    """For the fake (meta) implementations, which the C++ checks never see: a tensor on
    another device than q (e.g. a meta tensor among CPU tensors) is an error, as in C++."""
    for name, t in tensors.items():
        if t is not None and t.device != q.device:
            raise ValueError(f"flashgla: {name}: expected device {q.device} (that of q), got {t.device}")


def stream_of(device):
    """The current CUDA stream's handle for a CUDA device, 0 on the CPU."""
    if device.type != "cuda":
        return 0
    return torch.cuda.current_stream(device).cuda_stream


def workspace(device, num_bytes):
    """Scratch from torch's allocator (stream-ordered, capturable): (tensor, pointer)."""
    if num_bytes == 0:
        return None, 0
    buffer = torch.empty(num_bytes, dtype=torch.uint8, device=device)
    return buffer, buffer.data_ptr()


def on_device(device):
    """Makes `device` current for the call, so kernels launch where the tensors are."""
    if device.type == "cuda" and device.index != torch.cuda.current_device():
        return torch.cuda.device(device)
    return contextlib.nullcontext()


def run_op(function, workspace_bytes, device, args):
    """Calls flashgla._C `function(*args)` for tensors on `device`. On a CUDA device: with that device
    current, on torch's current stream, with scratch of `workspace_bytes(*args)` bytes from torch's
    allocator (stream-ordered, so CUDA graphs capture it)."""
    if device.type == "cpu":
        function(*args)
        return
    with on_device(device):
        num_bytes = workspace_bytes(*args)
        scratch, pointer = workspace(device, num_bytes)  # kept alive until the call has been queued
        function(*args, stream_of(device), pointer, num_bytes)
