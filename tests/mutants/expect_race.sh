#!/usr/bin/env bash
# expect_race.sh PROGRAM [ARGS...]
# Passes only if ThreadSanitizer reports a data race while PROGRAM runs: a
# race mutant that goes unreported fails the suite (docs/verification.md).
set -u
out=$(TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1" \
  "$@" 2>&1)
rc=$?
if grep -q "WARNING: ThreadSanitizer: data race" <<<"$out"; then
  echo "caught (exit $rc):"
  grep -m1 -A6 "WARNING: ThreadSanitizer: data race" <<<"$out"
  exit 0
fi
echo "NOT caught: no ThreadSanitizer report (exit $rc); last output:"
tail -n 20 <<<"$out"
exit 1
