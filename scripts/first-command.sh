#!/usr/bin/env bash
# The README's run command, as a new user on a machine with nothing but Rust
# runs it: a rustup home with rustup's default profile and the host target
# only (no musl target), and a PATH without musl-gcc (Debian's musl-tools).
# Nothing is removed from this machine: the rustup home is a copy (hard
# links) of this machine's default toolchain, the PATH a directory of links
# to /usr/bin's programs less musl's, both in a temporary directory that is
# removed at the end. rustup itself fetches what rust-toolchain.toml names
# (its toolchain and the musl target); the bundled C code is compiled by
# scripts/musl-cc, which falls back to the host's cc.
#
# Usage (as root, from the checkout): bash scripts/first-command.sh
#   FIRST_COMMAND_KEEP=1 keeps the temporary directory (its path is printed).
# Exits non-zero when the command fails; prints its time and the binary's size.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
[ "$(id -u)" = 0 ] || { echo "first-command.sh: run as root (the quickstart makes network namespaces)" >&2; exit 1; }

tmp=$(mktemp -d /tmp/first-command.XXXXXX)
cleanup() {
  if [ "${FIRST_COMMAND_KEEP:-}" = 1 ]; then echo "first-command.sh: kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT

# The machine's default toolchain, as a new user's `stable`.
sysroot=$(cd / && rustup run stable rustc --print sysroot)
host=$(cd / && rustup run stable rustc -vV | sed -n 's/^host: //p')
[ "$host" = x86_64-unknown-linux-gnu ] || { echo "first-command.sh: host $host: only x86_64 glibc hosts are covered" >&2; exit 1; }
rh=$tmp/rustup
mkdir -p "$rh/toolchains"
printf 'version = "12"\ndefault_toolchain = "stable-%s"\nprofile = "default"\n' "$host" >"$rh/settings.toml"
tc=$rh/toolchains/stable-$host
cp -al "$(readlink -f "$sysroot")" "$tc"
# Files rustup rewrites in place are copies, not links to this machine's.
for f in "$tc"/lib/rustlib/*; do
  [ -f "$f" ] && cp --remove-destination "$(readlink -f "$sysroot")/lib/rustlib/${f##*/}" "$f"
done
# The host target only, as rustup's defaults install it.
for t in "$tc"/lib/rustlib/*/; do
  t=${t%/}; t=${t##*/}
  case $t in "$host" | etc) ;; *)
    rm -rf "${tc:?}/lib/rustlib/$t" "$tc/lib/rustlib/manifest-rust-std-$t"
    sed -i "/-$t\$/d" "$tc/lib/rustlib/components" ;;
  esac
done
# ... and in rustup's record of the toolchain's components.
awk -v host="$host" '
  /^\[\[components\]\]/ { if (block != "" && keep) printf "%s", block; block = $0 "\n"; keep = 1; next }
  block != "" { block = block $0 "\n"; if ($0 ~ /^target = / && $0 != "target = \"" host "\"") keep = 0; next }
  { print }
  END { if (block != "" && keep) printf "%s", block }
' "$tc/lib/rustlib/multirust-config.toml" >"$tmp/multirust-config.toml"
mv "$tmp/multirust-config.toml" "$tc/lib/rustlib/multirust-config.toml"

# A PATH without musl-gcc: the cargo proxies, then links to /usr/bin less musl's.
mkdir -p "$tmp/bin"
for p in /usr/bin/*; do
  case ${p##*/} in *musl*) continue ;; esac
  ln -s "$p" "$tmp/bin/${p##*/}"
done
cargo_bin=$(dirname "$(command -v rustup)")
path="$cargo_bin:$tmp/bin"

run() {
  env -u RUSTUP_AUTO_INSTALL -u RUSTUP_TOOLCHAIN -u CARGO_BUILD_TARGET -u CC -u CFLAGS \
    RUSTUP_HOME="$rh" CARGO_TARGET_DIR="$tmp/target" PATH="$path" "$@"
}

# What the new user has, checked.
if run sh -c 'command -v musl-gcc'; then
  echo "first-command.sh: musl-gcc is on the test's PATH" >&2; exit 1
fi
installed=$(cd / && run rustup target list --installed)
[ "$installed" = "$host" ] || { echo "first-command.sh: the copy has targets: $installed" >&2; exit 1; }
echo "first-command.sh: rustup home $rh (targets: $installed), no musl-gcc on PATH"

# The README's run command, as written there.
t0=$SECONDS
run bash -c 'cargo build --release && cargo run --release --example quickstart'
echo "first-command.sh: the README's run command passed in $((SECONDS - t0)) s" \
  "(binary $(stat -c %s "$tmp"/target/x86_64-unknown-linux-musl/release/calico) B," \
  "toolchain $(run rustup show active-toolchain | cut -d' ' -f1))"
