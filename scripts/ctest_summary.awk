# Filters CTest's output for scripts/test.sh (the log keeps all of it).
# - The long list of skipped tests ("The following tests did not run: ... (Skipped)") is dropped; its
#   count goes into the summary. CTest marks a GoogleTest skip (GTEST_SKIP) as skipped (CMakeLists.txt).
# - CTest's summary "100% tests passed out of 620" counts a skipped test as passed;
#   it is rewritten in place as "CTest: 207 passed, 413 skipped, 0 failed out of 620 ...". What
#   follows it (the failed tests' list, errors) is held until the end so that the skipped count is
#   known, and printed after it unchanged.
# Usage: awk -v logfile=LOG -f scripts/ctest_summary.awk
/^The following tests did not run:/ { listing = 1; next }
listing && / \(Skipped\)$/ { skipped++; next }
{ listing = 0 }
# "100% tests passed out of N" without failures, "75% tests passed, 1 tests failed out of N" with them.
summary == "" && /% tests passed(, [0-9]+ tests? failed)? out of [0-9]+/ { summary = $0; next }
summary != "" { held[++count] = $0; next }
{ print }
END {
  if (summary != "") {
    failed = match(summary, /[0-9]+ tests? failed/) ? substr(summary, RSTART, RLENGTH) + 0 : 0
    match(summary, /out of [0-9]+/); total = substr(summary, RSTART + 7, RLENGTH - 7) + 0
    line = "CTest: " (total - failed - skipped) " passed, " skipped + 0 " skipped, " failed " failed out of " total
    if (skipped) line = line " (skipped: GTEST_SKIP; their names are in " logfile ")"
    print line
  }
  for (i = 1; i <= count; i++) print held[i]
}
