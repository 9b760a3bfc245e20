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
echo "== tests" >&2
# Release mode: the end-to-end tests move hundreds of MiB through the mount.
cargo test --workspace --release -- --test-threads=2
