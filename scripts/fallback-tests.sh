#!/usr/bin/env bash
# Runs the tests again with every Linux fast path off, so that the portable
# paths a Mac runs (src/sys/platform.rs) are run here: the unit tests, the
# strict reader's hostile unpack tests (reader), pack, and the mount and
# seal tests (seal, mount_bad). SESSIONFS_TEST_FALLBACKS=1 is read by debug
# builds only, as `cargo test` builds the library and the binary; a release
# build has no such switch.
set -euo pipefail
cd "$(dirname "$0")/.."
export SESSIONFS_TEST_FALLBACKS=1 SESSIONFS_REQUIRE_FUSE="${SESSIONFS_REQUIRE_FUSE:-1}"
# Skipped: what a mount inside a credential directory hides can be told
# only by openat2's RESOLVE_NO_XDEV; the fallback's own behaviour (read
# nothing there, warn) is checked by
# a_hard_link_into_a_credential_directory_is_left_out_or_warned_of.
cargo test --lib --test reader --test pack --test seal --test mount_bad -- \
  --skip other_names_of_files_in_excluded_directories_are_excluded
echo "fallback-tests: passed with every portable fallback forced"
