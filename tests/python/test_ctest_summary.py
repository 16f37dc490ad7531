"""scripts/test.sh's filter of CTest's output (scripts/ctest_summary.awk): CTest's "100% tests passed
... out of N" counts skipped tests as passed, so the filter rewrites that line with the skipped count,
drops the skipped tests' names (left to the log) and keeps every failure."""

import pathlib
import shutil
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
AWK = shutil.which("awk")
pytestmark = pytest.mark.skipif(AWK is None, reason="awk is not installed")


def summarise(ctest_output):
    result = subprocess.run([AWK, "-v", "logfile=build/test-logs/ctest.log", "-f",
                             str(REPO / "scripts" / "ctest_summary.awk")],
                            input=ctest_output, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout


PASSED_AND_SKIPPED = """Test project /repo/build
1/4 Test #1: Gla.Cpu ..........   Passed    0.10 sec
2/4 Test #2: Gla.Cuda .........***Skipped   0.01 sec
3/4 Test #3: Attention.Cuda ...***Skipped   0.01 sec
4/4 Test #4: Cli.Options ......   Passed    0.02 sec

100% tests passed out of 4

Total Test time (real) =   0.15 sec

The following tests did not run:
\t  2 - Gla.Cuda (Skipped)
\t  3 - Attention.Cuda (Skipped)
"""


def test_the_summary_line_says_how_many_were_skipped():
    out = summarise(PASSED_AND_SKIPPED)
    assert "100% tests passed" not in out, out
    assert ("CTest: 2 passed, 2 skipped, 0 failed out of 4 (skipped: GTEST_SKIP; their names are in "
            "build/test-logs/ctest.log)") in out.splitlines(), out
    assert "(Skipped)" not in out and "did not run" not in out, "the skipped names belong to the log"
    assert "1/4 Test #1: Gla.Cpu" in out and "Total Test time" in out


def test_failures_stay_visible_after_the_summary_line():
    failing = PASSED_AND_SKIPPED.replace("4/4 Test #4: Cli.Options ......   Passed", "4/4 Test #4: Cli.Options ......***Failed")
    failing = failing.replace("100% tests passed out of 4", "75% tests passed, 1 tests failed out of 4")
    failing += "\nThe following tests FAILED:\n\t  4 - Cli.Options (Failed)\nErrors while running CTest\n"
    lines = summarise(failing).splitlines()
    summary = lines.index("CTest: 1 passed, 2 skipped, 1 failed out of 4 (skipped: GTEST_SKIP; their names are in "
                          "build/test-logs/ctest.log)")
    assert lines[summary + 1:] == ["", "Total Test time (real) =   0.15 sec", "", "", "The following tests FAILED:",
                                   "\t  4 - Cli.Options (Failed)", "Errors while running CTest"], lines


def test_without_skips_the_line_says_0_skipped():
    out = summarise("1/1 Test #1: Gla.Cpu ...   Passed 0.1 sec\n\n100% tests passed out of 1\n")
    assert out.splitlines()[-1] == "CTest: 1 passed, 0 skipped, 0 failed out of 1", out
