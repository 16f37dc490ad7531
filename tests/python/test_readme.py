"""Every ```python block of README.md runs as written, on the CPU, each in a fresh interpreter in an
empty folder (what it writes, e.g. save_pretrained("ckpt"), lands there).

A block may be marked on the line just above its fence:
  <!-- readme-test: skip (why) -->                  not run here (several processes, files of your own);
                                                    reported as skipped with the reason
  <!-- readme-test: requires module, module -->     skipped when one of these modules is not installed
  <!-- readme-test: torchrun N -->                  run as a script under torchrun --nproc_per_node N (gloo)
Every other block must run. The GPU is hidden from the blocks (CUDA_VISIBLE_DEVICES=""), so on a GPU
machine too they take their CPU branch (`device = "cuda" if torch.cuda.is_available() else "cpu"`)."""

import importlib.util
import os
import pathlib
import re
import subprocess
import sys

import pytest

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
MARKER = re.compile(r"^<!-- readme-test: (skip|requires|torchrun) ?(.*?) ?-->$")


def python_blocks():
    """(line of the fence, marker kind or None, marker text, code) for every ```python block."""
    lines = README.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
            assert end is not None, f"README.md:{i + 1}: a ```python block that never closes"
            marker = MARKER.match(lines[i - 1].strip()) if i > 0 else None
            kind, text = (marker.group(1), marker.group(2)) if marker else (None, "")
            blocks.append((i + 1, kind, text, "\n".join(lines[i + 1:end]) + "\n"))
            i = end
        i += 1
    return blocks


BLOCKS = python_blocks()


def free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_readme_has_python_blocks_and_well_formed_markers():
    assert len(BLOCKS) >= 5, f"README.md: expected its Python examples as ```python blocks, found {len(BLOCKS)}"
    for line, kind, text, _ in BLOCKS:
        if kind == "skip":
            assert re.fullmatch(r"\(.+\)", text), f"README.md:{line}: a skip marker says why: skip (reason)"
        if kind == "requires":
            assert text, f"README.md:{line}: a requires marker names the modules"
        if kind == "torchrun":
            assert re.fullmatch(r"[1-9][0-9]*", text), f"README.md:{line}: torchrun N, N the number of processes"
    for number, text in enumerate(README.read_text().splitlines(), 1):
        if text.startswith("<!-- readme-test") and not MARKER.match(text.strip()):
            pytest.fail(f"README.md:{number}: unknown readme-test marker {text!r}")


@pytest.mark.parametrize("line, kind, text, code", BLOCKS, ids=[f"README.md:{b[0]}" for b in BLOCKS])
def test_readme_block_runs(tmp_path, line, kind, text, code):
    if kind == "skip":
        pytest.skip(f"README.md:{line}: marked skip {text}")
    if kind == "requires":
        missing = [m for m in re.split(r"[,\s]+", text) if m and importlib.util.find_spec(m) is None]
        if missing:
            pytest.skip(f"README.md:{line}: needs {', '.join(missing)} (not installed)")
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    command = [sys.executable, "-c", code]
    if kind == "torchrun":
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_gloo_available()):
            pytest.skip(f"README.md:{line}: needs torch.distributed with gloo")
        (tmp_path / "block.py").write_text(code)
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", text,
                   "--master_port", str(free_port()), "block.py"]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (f"README.md:{line}: the block failed (exit {result.returncode}):\n{code}\n"
                                    f"--- stderr ---\n{result.stderr[-4000:]}")
