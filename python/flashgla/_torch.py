"""From torch tensors to the arguments of flashgla._C.

Mostly used inside the ops' implementations (never traced by torch.compile):
an op fills its args struct (flashgla._C.GlaForwardArgs, ...) by field name,
tensors become flashgla._C.TensorView (data pointer, dtype, device, shape,
strides), the CUDA stream is torch's current one, and scratch memory comes
from torch's allocator when the op asks for it, so the C++ side never
allocates or synchronises.
"""

import contextlib
import functools
import numbers

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
    """The flashgla._C.TensorView of a tensor; None stays None. `name` names it in errors."""
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
        return _C.TensorView(t.data_ptr(), code, _C.DEVICE_CPU, 0, t.shape, t.stride(), name)
    if t.is_cuda:
        return _C.TensorView(t.data_ptr(), code, _C.DEVICE_CUDA, t.get_device(), t.shape, t.stride(), name)
    raise ValueError(f"flashgla: {name}: expected a CPU or CUDA tensor, got device {t.device}")


def make_args(struct, **fields):
    """An args struct of flashgla._C (e.g. _C.GlaForwardArgs) with the given fields: a tensor becomes its
    TensorView (named by its field), None leaves the field at its default (a tensor left out), anything
    else is set as is. A misspelt field is an AttributeError."""
    args = struct()
    for name, value in fields.items():
        if value is None:
            continue
        if isinstance(value, torch.Tensor):
            value = view(value, name)
        setattr(args, name, value)
    return args


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
    """The current CUDA stream's handle for a CUDA device, 0 on the CPU. torch's raw-stream query costs a tenth
    of building a torch.cuda.Stream (about 0.2 against 10 µs per call on the H200 host; a decode step pays
    it once per op and layer); builds without it take the public way."""
    if device.type != "cuda":
        return 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    if _raw_stream is not None:
        return _raw_stream(index)
    return torch.cuda.current_stream(index).cuda_stream


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


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


def run_op(function, args, device, scratch=True):
    """Calls the flashgla._C op `function(args)` for tensors on `device`. On a CUDA device: with that device
    current, on torch's current stream, and (scratch: for an op that may need scratch) with the scratch the
    op asks for after checking and planning (its own, and any staging buffer), from torch's allocator:
    stream-ordered, so CUDA graphs capture it. On the CPU nothing is allocated."""
    if device.type == "cpu":
        function(args)
        return
    with on_device(device):
        args.stream = stream_of(device)
        if scratch:
            function(args, _allocator(device))
        else:
            function(args)


@functools.lru_cache(maxsize=None)
def _allocator(device):
    """workspace bound to `device`: one callable per device, not a new partial per call."""
    return functools.partial(workspace, device)


def forbid_double_backward(backward_op, op_name):
    """Gives the custom op `backward_op` (the gradients of `op_name`) an autograd formula that
    refuses: the kernels have no second derivative, and a gradient of a gradient (create_graph=True,
    then backward through the gradient) must say so instead of failing somewhere inside torch."""

    def refuse(ctx, *grads):
        raise NotImplementedError(
            f"flashgla: {op_name}: double backward is not supported (the gradient of {op_name}'s gradient, "
            "as with torch.autograd.grad(..., create_graph=True) followed by a backward through the result); "
            "first-order gradients work")

    backward_op.register_autograd(refuse, setup_context=lambda ctx, inputs, output: None)


def as_scale(scale, op_name, hint=""):
    """The optional float `scale`; a tensor is a TypeError: in its place it is a positional argument one slot
    off, and a 0-d one would get no gradient (and, on CUDA, be read back with a synchronisation)."""
    if scale is None:
        return None
    if isinstance(scale, torch.Tensor):
        if scale.dim() == 0:
            raise TypeError(f"flashgla: scale: {op_name} expects a number (or None), got a 0-d tensor: pass "
                            "float(scale) (scale gets no gradient)")
        raise TypeError(f"flashgla: scale: {op_name} expects a number (or None), got a tensor of shape "
                        f"{list(scale.shape)}{hint}")
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"flashgla: scale: {op_name} expects a number (or None), got {type(scale).__name__}")
    return float(scale)
