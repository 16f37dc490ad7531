"""`flashgla check` says on stderr which case runs before it runs it (large sizes take minutes in the
fp64 reference), and keeps stdout the table alone."""

import pathlib
import shutil
import subprocess
import sysconfig

# The package's command; where the package is unpacked onto PYTHONPATH instead of installed (the GPU runs of
# scripts/gpu_session.sh), the one on PATH.
COMMAND = pathlib.Path(sysconfig.get_path("scripts")) / "flashgla"
if not COMMAND.exists() and shutil.which("flashgla"):
    COMMAND = pathlib.Path(shutil.which("flashgla"))


def run_check(*flags):
    result = subprocess.run([str(COMMAND), "check", "--device", "cpu", "-B", "1", "-T", "20", "-H", "1", "-K", "8",
                             "-V", "8", *flags], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_check_prints_a_progress_line_per_case_on_stderr():
    result = run_check()
    cases = ["gla chunked fwd", "gla chunked bwd", "gla recurrent fwd", "gla recurrent bwd", "gla decode x16",
             "attention fwd", "attention bwd"]
    expected = [f"check {i}/{len(cases)}: {case} (fp64 reference, then cpu f32)" for i, case in enumerate(cases, 1)]
    assert result.stderr.splitlines() == expected, result.stderr
    assert "check 1/" not in result.stdout, "progress lines belong on stderr, not in the table"
    assert result.stdout.splitlines()[-1].startswith("all ") and "rows pass" in result.stdout


def test_progress_counts_only_the_cases_asked_for():
    result = run_check("--ops", "decode,attention", "--dtype", "f64")
    assert result.stderr.splitlines() == ["check 1/3: gla decode x16 (fp64 reference, then cpu f64)",
                                          "check 2/3: attention fwd (fp64 reference, then cpu f64)",
                                          "check 3/3: attention bwd (fp64 reference, then cpu f64)"], result.stderr
