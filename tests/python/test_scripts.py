"""scripts/cuda_choice.sh (sourced by scripts/run.sh and scripts/test.sh): the CUDA backend is built only
where a GPU is visible and nvcc found, or when asked, and the line printed says which and how to get the
other. A fake nvidia-smi and nvcc on PATH stand for the machine."""

import pathlib
import shutil
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def choose(tmp_path, gpu, nvcc, asked=None):
    """Runs flashgla_choose_cuda with fake tools; returns (FLASHGLA_CUDA_BUILD, printed line, status)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    tools = {"nvidia-smi": None if gpu is None else (0 if gpu else 9), "nvcc": 0 if nvcc else None}
    for name, status in tools.items():
        if status is not None:
            (bin_dir / name).write_text(f"#!/bin/sh\nexit {status}\n")
            (bin_dir / name).chmod(0o755)
    # Only the fake tools on PATH (the function uses shell builtins besides them); /usr/local/cuda/bin,
    # which cuda_choice.sh adds when nvcc is missing, is hidden again after sourcing.
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path)}
    if asked is not None:
        env["FLASHGLA_CUDA"] = asked
    script = (f'source scripts/cuda_choice.sh; PATH="{bin_dir}"; '
              'flashgla_choose_cuda scripts/test.sh && echo "BUILD=$FLASHGLA_CUDA_BUILD"')
    result = subprocess.run([shutil.which("bash"), "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=60)
    build = None
    for line in result.stdout.splitlines():
        if line.startswith("BUILD="):
            build = line[len("BUILD="):]
    return build, result.stdout + result.stderr, result.returncode


@pytest.mark.parametrize("gpu", [None, False])
def test_no_gpu_builds_the_cpu_backend_and_says_how_to_get_cuda(tmp_path, gpu):
    build, text, status = choose(tmp_path, gpu=gpu, nvcc=True)
    assert status == 0 and build == "OFF", text
    assert "CPU backend only" in text and "no GPU is visible" in text and "FLASHGLA_CUDA=ON" in text, text


def test_gpu_and_nvcc_build_cuda_and_say_how_to_skip_it(tmp_path):
    build, text, status = choose(tmp_path, gpu=True, nvcc=True)
    assert status == 0 and build == "ON", text
    assert "CPU and CUDA backends" in text and "FLASHGLA_CUDA=OFF" in text, text


def test_gpu_without_nvcc_says_nvcc_is_missing(tmp_path):
    build, text, status = choose(tmp_path, gpu=True, nvcc=False)
    assert status == 0 and build == "OFF", text
    assert "nvcc was not found" in text, text


@pytest.mark.parametrize("asked, expected", [("ON", "ON"), ("OFF", "OFF")])
def test_asked_for_explicitly(tmp_path, asked, expected):
    build, text, status = choose(tmp_path, gpu=False, nvcc=True, asked=asked)
    assert status == 0 and build == expected, text
    assert f"FLASHGLA_CUDA={asked}" in text, text


def test_bad_value_is_refused(tmp_path):
    build, text, status = choose(tmp_path, gpu=False, nvcc=True, asked="maybe")
    assert status != 0 and build is None and "ON, OFF or AUTO" in text, text


def test_ci_asks_for_the_cuda_sources_to_compile():
    """Project rule: CI (no GPU) still compiles every CUDA source; only the wheel stays CPU-only."""
    ci = (REPO / ".ci" / "run").read_text()
    assert "FLASHGLA_CUDA=ON" in ci and "FLASHGLA_PYTHON_CUDA=OFF" in ci and "scripts/test.sh" in ci
