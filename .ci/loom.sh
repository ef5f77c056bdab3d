#!/usr/bin/env bash
# Loom models of the handover mailbox and its wakeup (src/handover/loom_tests.rs).
#
# LOOM_MAX_PREEMPTIONS=2 bounds the search the way tokio and crossbeam do. The models run in
# well under a second (at 2, and also at 3); the time is in the build, about 3 minutes from cold
# on 2 cores and seconds after that. A separate target directory keeps the loom build
# from invalidating the normal one. Extra arguments go to the test binary (e.g. `-- --nocapture`).
#
# The cfg is `kafka_source_loom`, not the customary `loom`: tokio itself reacts to `--cfg loom`
# by compiling out `tokio::net`, which the rest of this crate needs to build.
set -euo pipefail
cd "$(dirname "$0")/.."

export RUSTFLAGS="--cfg kafka_source_loom ${RUSTFLAGS:-}"
export LOOM_MAX_PREEMPTIONS="${LOOM_MAX_PREEMPTIONS:-2}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/loom"

cargo test --lib --release handover "$@"
