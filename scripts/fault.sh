#!/usr/bin/env bash
# Jepsen-style fault tests: builds stoa and stoa-fault and runs them as root. Every node
# of the cluster gets its own network namespace; see docs/FAULT_TESTS.md.
#
#   scripts/fault.sh                 # the short run (every scenario once, seeded order, about 6 minutes)
#   scripts/fault.sh --long          # every scenario twice
#   scripts/fault.sh --seed N [...]  # replay a run; --scenario NAME, --list
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
[ -x "$HOME/.cargo/bin/cargo" ] && export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --quiet --bin stoa --bin stoa-fault
exec target/release/stoa-fault "$@"
