"""The installed package: version, metadata, the `flashgla` command, and the
errors when torch or the compiled extension is missing."""

import importlib.metadata
import os
import pathlib
import re
import subprocess
import sys
import sysconfig

import flashgla

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_version_is_the_cpp_librarys():
    cmake_version = re.search(r"project\(flashgla VERSION ([0-9.]+)", (REPO / "CMakeLists.txt").read_text()).group(1)
    assert flashgla.__version__ == flashgla._C.version() == cmake_version
    assert importlib.metadata.version("flashgla") == cmake_version


def test_metadata_license_and_no_hard_torch_dependency():
    metadata = importlib.metadata.metadata("flashgla")
    assert metadata.get("License") or metadata.get("License-Expression")
    for requirement in importlib.metadata.requires("flashgla") or []:
        if requirement.startswith("torch"):
            assert "extra ==" in requirement, f"torch must only be an extra, got {requirement!r}"


def test_command_is_installed():
    command = pathlib.Path(sysconfig.get_path("scripts")) / "flashgla"
    assert command.is_file(), f"{command} is missing"
    result = subprocess.run([str(command), "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert flashgla.__version__ in result.stdout


def run_python(code):
    """Runs `code` in a fresh interpreter (outside this directory, so the installed package is used)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=os.path.dirname(sys.executable))


def test_ops_without_torch_say_what_is_missing():
    result = run_python(
        "import sys; sys.modules['torch'] = None\n"
        "import flashgla\n"
        "print(flashgla.__version__, flashgla.cuda_available())\n"
        "try:\n"
        "    from flashgla import chunk_gla\n"
        "except ImportError as error:\n"
        "    print('ImportError:', error)\n")
    assert result.returncode == 0, result.stderr
    assert flashgla.__version__ in result.stdout
    assert "ImportError: flashgla.chunk_gla is a PyTorch op and needs torch >= 2.4" in result.stdout
    assert "torch is not installed" in result.stdout


def test_ops_with_old_torch_say_what_is_missing():
    result = run_python(
        "import sys, types; sys.modules['torch'] = types.SimpleNamespace(__version__='2.3.1')\n"
        "import flashgla\n"
        "try:\n"
        "    flashgla.flash_attention\n"
        "except ImportError as error:\n"
        "    print('ImportError:', error)\n")
    assert result.returncode == 0, result.stderr
    assert "needs torch >= 2.4 (found torch 2.3.1)" in result.stdout


def test_missing_extension_says_how_to_install():
    result = run_python("import sys; sys.modules['flashgla._C'] = None\nimport flashgla\n")
    assert result.returncode != 0
    assert "ImportError: flashgla's compiled extension flashgla._C could not be loaded" in result.stderr
    assert "pip install ." in result.stderr


def test_ops_are_registered_custom_ops():
    import torch

    for name in ("chunk_gla", "fused_recurrent_gla", "chunk_simple_gla", "chunk_linear_attn", "gla_decode_step",
                 "gla_prefill", "flash_attention", "chunk_gla_backward", "flash_attention_backward"):
        assert hasattr(torch.ops.flashgla, name), name
