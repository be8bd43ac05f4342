#!/usr/bin/env bash
# Fuzzes the plugin's parsers: every cargo-fuzz target of fuzz/
# (or those named in FUZZ_TARGETS) for ${FUZZ_SECONDS:-60} s each, one
# process at a time, with AddressSanitizer and debug assertions. Installs
# cargo-fuzz if it is missing. cargo-fuzz needs nightly's -Z flags:
# RUSTC_BOOTSTRAP=1 lets the stable toolchain accept them.
#
# New inputs go to fuzz/work/<target>/ (ignored by git); fuzz/corpus/<target>/
# holds the committed seeds and is only read. A crash leaves its input in
# fuzz/artifacts/<target>/ and fails the script (after the other targets
# have run); each run's libFuzzer log is fuzz/work/<target>.log.
#
#   bash scripts/fuzz.sh                              # all, 60 s each
#   FUZZ_SECONDS=600 FUZZ_TARGETS="selector netconf" bash scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${FUZZ_SECONDS:-60}
read -r -a targets <<<"${FUZZ_TARGETS:-netconf cni_env cni_args prev_result annotations selector kubeconfig}"
export RUSTC_BOOTSTRAP=1

if ! cargo fuzz --version >/dev/null 2>&1; then
  cargo install --locked cargo-fuzz --version '^0.13'
fi

# One build of every target; the runs below reuse it (same flags).
flags=(--release --debug-assertions)
cargo fuzz build "${flags[@]}"

failed=()
for t in "${targets[@]}"; do
  mkdir -p "fuzz/work/$t"
  echo "fuzz.sh: $t for ${seconds} s"
  # -timeout: an input that takes 10 s is a hang, reported like a crash.
  if cargo fuzz run "${flags[@]}" "$t" "fuzz/work/$t" "fuzz/corpus/$t" -- \
      -max_total_time="$seconds" -timeout=10 -print_final_stats=1 \
      >"fuzz/work/$t.log" 2>&1; then
    grep -E '^#[0-9]+[[:space:]]+DONE|^Done [0-9]+ runs' "fuzz/work/$t.log" | sed "s/^/fuzz.sh: $t: /"
  else
    echo "fuzz.sh: $t FAILED (see fuzz/work/$t.log and fuzz/artifacts/$t/):"
    grep -E 'panicked at|ERROR: |SUMMARY: ' "fuzz/work/$t.log" | head -5 | sed 's/^/  /'
    failed+=("$t")
  fi
done
if ((${#failed[@]})); then
  echo "fuzz.sh: crashes in: ${failed[*]}"
  exit 1
fi
echo "fuzz.sh: ${#targets[@]} targets, ${seconds} s each, no crash"
