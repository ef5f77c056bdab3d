#!/usr/bin/env bash
# The benchmarks, briefly: every criterion bench once in test mode, then the comparison
# harness's quick run against a broker it starts itself, with the full run's shape (one warm-up
# round, five measured rounds, interleaved) on small topics. It checks that every consumer runs
# and reads the whole topic in every round and that the report is written (the harness prints
# it); its figures are too short to quote (the README's performance section comes from a full
# run).
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== criterion benches, each benchmark once"
cargo test --release --benches

manifest=benches/compare/Cargo.toml
echo "== comparison harness: rustfmt, clippy"
cargo fmt --manifest-path "$manifest" -- --check
# --release, so that librdkafka's C build is shared with the run below.
cargo clippy --release --manifest-path "$manifest" --all-targets -- -D warnings
echo "== comparison harness, quick run"
cargo run --release --manifest-path "$manifest" -- --quick --reps 5 --warmups 1

out="${CARGO_TARGET_DIR:-target}/compare"
for f in report.md runs.csv throughput.png cpu.png latency.png rss.png; do
  [ -s "$out/$f" ] || { echo "the comparison harness did not write $out/$f" >&2; exit 1; }
done
