"""The memory check every op runs before it allocates its outputs: a call whose outputs (and, on the CPU,
the backend's own scratch) cannot fit the device raises an error naming the op, the argument and the sizes,
instead of torch's allocator message or the kernel's OOM killer.

Only requests of at least CHECK_FROM_BYTES are checked: below that the check costs nothing (no driver call
or /proc read), and a small request that fails still gets torch's error.
"""

import math
import os

import torch

CHECK_FROM_BYTES = 1 << 30

# What the CPU backend needs beyond its inputs, as a multiple of the fp32 bytes of q plus v (one tensor of
# keys and one of values), outputs included. The recurrent reference copies whole sequences in fp64: the growth
# of ru_maxrss over a call at T = 2^18, H = 2, K = V = 64 on a 2-core machine (with K/V from 1/4 to 4 the need
# differs by up to about 25% either way, so a call within that much of the limit may pass or be refused). The
# chunked path works one range of tokens per thread at a time (src/cpu/gla/gla.cpp; tens of MiB in all,
# bench/notes_gla_cpu.md): its need is its outputs, so its factor is 0. Update them when the CPU path's
# scratch changes.
CPU_SCRATCH_FACTOR = {
    "chunked_forward": 0.0,
    "chunked_backward": 0.0,
    "recurrent_forward": 5.2,
    "recurrent_backward": 6.5,
}


def _gib(num_bytes):
    return f"{num_bytes / (1 << 30):.1f} GiB"


def nbytes(shape, dtype):
    """Bytes of a tensor of this shape and dtype (no tensor is made)."""
    return math.prod(shape) * dtype.itemsize


def _cpu_available():
    """Bytes the kernel can still give this process (MemAvailable: free memory plus reclaimable caches),
    or None where /proc/meminfo is missing."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _cuda_available(device):
    """Free device memory plus what torch's caching allocator holds unused (it reuses that first); None while
    a CUDA graph is being captured (no driver queries there: the capture's memory is torch's private pool)."""
    if torch.cuda.is_current_stream_capturing():
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def available_bytes(device):
    """Bytes the device can still allocate, or None where that is unknown (then nothing is checked)."""
    if device.type == "cpu":
        return _cpu_available()
    if device.type == "cuda":
        return _cuda_available(device)
    return None


def require_memory(op, device, need_bytes, what, argument="q"):
    """MemoryError (torch.OutOfMemoryError on CUDA, a subclass of RuntimeError) when `need_bytes` exceed what
    `device` can still allocate. `what` says what the bytes are, in the caller's terms (shapes, dtypes,
    scratch); `argument` is the argument whose size decides them."""
    if need_bytes < CHECK_FROM_BYTES:
        return
    available = available_bytes(device)
    if available is None or need_bytes <= available:
        return
    where = "the CPU has" if device.type == "cpu" else f"{device} has"
    message = (f"flashgla: {argument}: {op} needs about {_gib(need_bytes)} ({need_bytes} bytes) for {what}, but "
               f"{where} {_gib(available)} available; split the call (fewer sequences or tokens per call) "
               "or free memory")
    if device.type == "cuda":
        raise torch.OutOfMemoryError(message)
    raise MemoryError(message)


def describe(name, shape, dtype):
    """'o [1, 16777216, 2, 64] float32 (8.0 GiB)'."""
    return f"{name} {list(shape)} {str(dtype).replace('torch.', '')} ({_gib(nbytes(shape, dtype))})"


def cpu_scratch_bytes(path, q, v):
    """The CPU backend's need for `path` (a CPU_SCRATCH_FACTOR key), from q and v's element counts."""
    return int(CPU_SCRATCH_FACTOR[path] * 4 * (q.numel() + v.numel()))


def require_outputs(op, device, outputs, argument="q", cpu_path=None, q=None, v=None):
    """The check of an op about to allocate `outputs` ((name, shape, dtype) triples) on `device`; on the CPU
    with `cpu_path` the backend's scratch (cpu_scratch_bytes of q, v, which counts the outputs too) when
    larger. Costs a few multiplications below CHECK_FROM_BYTES."""
    out_bytes = sum(nbytes(shape, dtype) for _, shape, dtype in outputs)
    need, what = out_bytes, "its outputs"
    if cpu_path is not None and device.type == "cpu" and q is not None and v is not None:
        scratch = cpu_scratch_bytes(cpu_path, q, v)
        if scratch > need:
            need, what = scratch, f"its outputs and the CPU backend's scratch (about {CPU_SCRATCH_FACTOR[cpu_path]}x " \
                                  "the fp32 bytes of q and v)"
    if need < CHECK_FROM_BYTES:
        return
    listed = ", ".join(describe(*output) for output in outputs)
    require_memory(op, device, need, f"{what}: {listed}", argument)
