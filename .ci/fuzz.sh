#!/usr/bin/env bash
# Runs every fuzz target (or those named as arguments) over its corpus for a bounded time, on the
# stable toolchain. See fuzz/README.md.
#
#   .ci/fuzz.sh                      # every target, FUZZ_SECONDS (default 60) each
#   FUZZ_SECONDS=3600 .ci/fuzz.sh frame
#
# cargo-fuzz passes `-Zsanitizer=address` and other `-Z` flags to rustc; RUSTC_BOOTSTRAP=1 lets
# the stable compiler accept them, so no nightly toolchain is needed. cargo-fuzz itself is
# installed from crates.io if missing.
#
# The committed seeds in fuzz/corpus/<target> are read, never written: libFuzzer adds what it
# finds to fuzz/target/corpus/<target> (kept between runs, not committed). A crash or timeout
# leaves its input in fuzz/artifacts/<target>/ and makes the script exit non-zero once every
# target has run. Logs are in fuzz/target/logs/<target>.log.
#
# FUZZ_KEEP_GOING=1 runs libFuzzer in fork mode with -ignore_ooms/-ignore_crashes/-ignore_timeouts:
# every finding is still saved (and still fails the script), but fuzzing goes on past it. Use it
# while a known finding (fuzz/regressions/) is unfixed, or it stops the target within seconds.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${FUZZ_SECONDS:-60}"
toolchain="${FUZZ_TOOLCHAIN:-stable}"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(record_batch frame fetch_response commit_machine mailbox consumer_protocol classic_member consumer_member fetch_session)
fi

if ! cargo "+$toolchain" fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz"
    cargo "+$toolchain" install cargo-fuzz --locked
fi

export RUSTC_BOOTSTRAP=1
fuzz() { cargo "+$toolchain" fuzz "$@"; }

echo "== building ${targets[*]}"
for t in "${targets[@]}"; do
    fuzz build "$t"
done

keep_going=()
if [ "${FUZZ_KEEP_GOING:-0}" = 1 ]; then
    keep_going=(-fork=1 -ignore_ooms=1 -ignore_crashes=1 -ignore_timeouts=1)
fi

mkdir -p fuzz/target/logs
failed=()
for t in "${targets[@]}"; do
    echo "== $t: ${seconds}s"
    mkdir -p "fuzz/target/corpus/$t" "fuzz/corpus/$t"
    mkdir -p "fuzz/artifacts/$t"
    log="fuzz/target/logs/$t.log"
    before=$(find "fuzz/artifacts/$t" -type f | wc -l)
    status=0
    fuzz run "$t" "fuzz/target/corpus/$t" "fuzz/corpus/$t" -- \
        -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=30 -print_final_stats=1 \
        "${keep_going[@]}" >"$log" 2>&1 || status=$?
    found=$(($(find "fuzz/artifacts/$t" -type f | wc -l) - before))
    # The last status line: "#123456 DONE cov: 812 ft: 2345 corp: 310/40Kb ..." (fork mode:
    # "#123456: cov: 812 ft: 2345 corp: 310 exec/s: ... oom/timeout/crash: 1/0/0 ...").
    grep -E '^#[0-9]+' "$log" | tail -n 1 || true
    if [ "$status" -ne 0 ] || [ "$found" -gt 0 ]; then
        failed+=("$t")
        echo "$t: exit status $status, $found new input(s) in fuzz/artifacts/$t" >&2
        grep -E 'panicked|ERROR: |SUMMARY: ' "$log" | head -n 10 >&2 || true
    fi
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "== failed: ${failed[*]} (inputs in fuzz/artifacts/, logs in fuzz/target/logs/)" >&2
    exit 1
fi
echo "== no crashes"
