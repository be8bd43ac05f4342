#!/usr/bin/env bash
# Fails when link/symbol-order.txt has gone stale for the release binary:
# when more than SYMBOL_ORDER_MAX_MISSING_PCT percent (default 3) of its
# names are not symbols of the release `calico`. lld skips such names without
# a word (build.rs passes --no-warn-symbol-ordering, and rustc hides linker
# warnings anyway), the hot code is no longer packed, and peak RSS creeps
# back up (BENCHMARKS.md, "The symbol order and peak RSS"). Regenerate with scripts/symbol-order.sh.
#
# No second build: build.rs has the release link write its map (mangled
# names) to $OUT_DIR/calico.map, which lists every symbol of the output, as
# `nm` of the unstripped binary would (the binary itself is stripped). This
# script runs CI's own release build (scripts/test.sh), a no-op on a warm
# cache, asks cargo for that OUT_DIR, and compares the order file with the
# map's symbols.
#
#   SYMBOL_ORDER_FILE            the order file to judge (default link/symbol-order.txt)
#   SYMBOL_ORDER_MAX_MISSING_PCT the most missing names allowed, in percent (default 3)
#   SYMBOL_ORDER_SAMPLE          how many missing names to print (default 20)
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")/.."

order=${SYMBOL_ORDER_FILE:-link/symbol-order.txt}
max_pct=${SYMBOL_ORDER_MAX_MISSING_PCT:-3}
sample=${SYMBOL_ORDER_SAMPLE:-20}
[ -s "$order" ] || { echo "check-symbol-order: $order is missing or empty" >&2; exit 1; }
command -v jq >/dev/null || { echo "check-symbol-order: needs jq" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Exactly scripts/test.sh's release build (same target dir, profile,
# features and targets, so the same fingerprints): nothing to do when CI
# has just run it. --message-format only changes what cargo prints.
pkg=$(cargo pkgid)
if ! cargo build --locked --release --bins --examples --message-format=json >"$work/build.json"; then
  jq -r 'select(.reason == "compiler-message") | .message.rendered // empty' "$work/build.json" >&2 || true
  echo "check-symbol-order: the release build failed" >&2
  exit 1
fi
out_dir=$(jq -r --arg pkg "$pkg" \
  'select(.reason == "build-script-executed" and .package_id == $pkg) | .out_dir' "$work/build.json" | sort -u)
bin=$(jq -r --arg pkg "$pkg" \
  'select(.reason == "compiler-artifact" and .package_id == $pkg and .target.name == "calico"
          and (.target.kind | index("bin"))) | .executable' "$work/build.json")
map=$out_dir/calico.map
if [ "$(wc -l <<<"$out_dir")" != 1 ] || [ ! -s "$map" ]; then
  echo "check-symbol-order: no link map at ${map:-?} (build.rs writes it for the release link with lld)" >&2
  exit 1
fi
# The map is written by the link that produced the binary: a map older than
# the binary would belong to another link.
if [ -n "$bin" ] && [ "$(stat -c %Y "$map")" -lt "$(($(stat -c %Y "$bin") - 60))" ]; then
  echo "check-symbol-order: $map is older than $bin" >&2
  exit 1
fi

# lld's map: "VMA LMA Size Align" (49 columns), then the output section at
# indent 0, an input section at 8, a symbol at 16.
awk 'length($0) > 65 && substr($0, 50, 16) == "                " && substr($0, 66, 1) != " " {
       print substr($0, 66) }' "$map" | sort -u >"$work/symbols"
grep -v '^[[:space:]]*$' "$order" | sort -u >"$work/order"
comm -23 "$work/order" "$work/symbols" >"$work/missing"

total=$(wc -l <"$work/order")
missing=$(wc -l <"$work/missing")
symbols=$(wc -l <"$work/symbols")
[ "$symbols" -gt 0 ] || { echo "check-symbol-order: no symbols read from $map" >&2; exit 1; }
pct=$(awk -v m="$missing" -v t="$total" 'BEGIN { printf "%.2f", 100 * m / t }')
summary="$order: $missing of $total names ($pct%) are not in the release binary ($symbols symbols, from $map); at most $max_pct% allowed"
if awk -v p="$pct" -v max="$max_pct" 'BEGIN { exit !(p > max) }'; then
  echo "check-symbol-order: FAIL: $summary" >&2
  echo "check-symbol-order: missing, the first $sample in the file's order:" >&2
  # The file's own order (hottest first), not sorted.
  grep -Fxf "$work/missing" "$order" | head -n "$sample" | sed 's/^/  /' >&2
  echo "check-symbol-order: regenerate it with scripts/symbol-order.sh (as root, about 10 minutes)" >&2
  exit 1
fi
echo "check-symbol-order: ok: $summary"
