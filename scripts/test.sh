#!/usr/bin/env bash
# The whole test suite: installs what it needs, checks formatting and lints, then runs
# every unit, property and end-to-end test (the end-to-end tests start real clusters and
# mount them with FUSE, so this runs as root).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"

echo "== format" >&2
cargo fmt --all -- --check
echo "== lint" >&2
cargo clippy --workspace --all-targets --release -- -D warnings
echo "== unit tests" >&2
# Release mode: the end-to-end tests move GiBs through the mount; one build serves both.
cargo test --workspace --release --exclude stoa --exclude stoa-fault -- --test-threads=2
echo "== end-to-end tests" >&2
# One cluster at a time: each starts 6 processes and a FUSE mount on this machine. The
# fault run (stoa-fault) needs the stoa binary, which building -p stoa's tests provides.
# Every wait in these tests is bounded; this bound is the backstop that turns a hang
# nobody foresaw into a failure well inside CI's limit.
cargo build --release -p stoa -p stoa-fault --tests
timeout --kill-after=60 45m cargo test --release -p stoa -p stoa-fault -- --test-threads=1
