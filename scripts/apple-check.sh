#!/usr/bin/env bash
# Compile-checks sessionfs for macOS on this (Linux) machine: `cargo check`
# and `cargo clippy -D warnings` of every target of the crate (library,
# binaries, tests, benches) for aarch64-apple-darwin, and x86_64-apple-darwin
# too where code is arch-specific or APPLE_TARGETS=all.
# Links nothing, so no Mac SDK is needed; fuser's build script only asks
# pkg-config for macFUSE's "fuse", which scripts/apple/fuse.pc stands in for,
# and C compiled for the target by build scripts goes to scripts/apple/cc.
# Fails, saying so, when the targets cannot be installed: never skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=(x86_64-apple-darwin aarch64-apple-darwin)
# Both targets differ only where code asks for target_arch: when none of
# ours does, the Apple-silicon target alone sees every cfg of the crate,
# and CI spends half the time (APPLE_TARGETS=all checks both anyway).
if [ "${APPLE_TARGETS:-}" != all ] &&
  ! grep -rqE 'target_arch|target_pointer_width' src tests bench/src; then
  targets=(aarch64-apple-darwin)
fi
installed=$(rustup target list --installed 2>/dev/null || true)
for t in "${targets[@]}"; do
  grep -qx "$t" <<<"$installed" && continue
  if ! rustup target add "$t" >&2; then
    echo "apple-check: FAILED: cannot install the Rust target $t (rustup target add $t);" \
      "the macOS build cannot be checked on this machine" >&2
    exit 1
  fi
done
command -v pkg-config >/dev/null || {
  echo "apple-check: FAILED: pkg-config is missing (scripts/deps.sh installs it)" >&2
  exit 1
}
export PKG_CONFIG_ALLOW_CROSS=1 PKG_CONFIG_PATH="$PWD/scripts/apple"
# C the build scripts compile for the target (ring, under rustls): a
# stand-in that writes empty objects, since nothing is linked.
for t in "${targets[@]}"; do
  v=${t//-/_}
  export "CC_$v=$PWD/scripts/apple/cc" "AR_$v=$PWD/scripts/apple/cc"
done
# Apart from target/debug, so that host builds are not invalidated.
export CARGO_TARGET_DIR="${APPLE_TARGET_DIR:-$PWD/target/apple}"
# clippy denies rustc's warnings too; check without RUSTFLAGS shares the
# dependencies clippy builds, instead of building them a second time.
# Clippy compiles what `cargo check` does (a compile error fails it too),
# for the targets in one build so that both cores work on it.
cargo clippy --quiet "${targets[@]/#/--target=}" --all-targets -- -D warnings
# CI (.ci/run) has no use for these metadata files afterwards, and its disk
# may be small.
[ "${APPLE_CHECK_CLEAN:-}" != 1 ] || rm -rf "$CARGO_TARGET_DIR"
for t in "${targets[@]}"; do
  echo "apple-check: $t: check and clippy clean (all targets)"
done
