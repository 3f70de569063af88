# sessionfs. `make test` is what CI runs (.ci/run); `make check` is the same.
# bash, timing each recipe line that takes 10 s or more (scripts/make-shell).
SHELL := $(CURDIR)/scripts/make-shell
CARGO ?= cargo
export CARGO_TERM_COLOR ?= never

# Third-party suites are installed by their scripts when missing.
# (test-radosgw: opt-in, see below.)
.PHONY: test-radosgw test-moto-newest suites build release deps harness-deps test python-test unit check fmt fmt-check clippy apple-check fallback-tests doc demo bench bench-pack bench-chunks bench-remote bench-many bench-quick fuzz schema-check no-test-hooks clean

build:
	$(CARGO) build --workspace --all-targets

# The tool and the benchmark driver (bench/, a workspace member).
release:
	$(CARGO) build --release --workspace

deps:
	scripts/deps.sh

# The pinned harness CLIs (Codex, Claude Code, OpenCode) that
# tests/harness.rs resumes across mounts, into .harness/ when missing.
harness-deps:
	scripts/harness/install.sh

# The release binary the suites, the demo and the quick benchmark run is
# built without LTO and debug info here (10-23 s less of CI, measured); `make
# release` and `make bench` build it as Cargo.toml says.
CI_RELEASE := CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 CARGO_PROFILE_RELEASE_DEBUG=false

test: deps harness-deps fmt-check clippy apple-check doc
	SESSIONFS_REQUIRE_FUSE=1 SESSIONFS_REQUIRE_HARNESS=1 $(CARGO) test --all-targets --no-fail-fast
	SESSIONFS_REQUIRE_FUSE=1 scripts/python-tests.sh
	scripts/fallback-tests.sh
	$(CI_RELEASE) $(MAKE) schema-check no-test-hooks suites demo bench-quick
	FUZZ_SECONDS=$${FUZZ_SECONDS:-10} scripts/fuzz.sh

check: test

# Opt-in, not in `make test`: the remote write suite against Ceph's radosgw
# (Debian's packages, installed when missing; a one-node cluster on
# 127.0.0.1 made and torn down by the script): about 3 minutes, see
# docs/remote.md.
test-radosgw:
	scripts/radosgw.sh $(CARGO) test --test remote_write

# The remote suites against the newest moto (.venv-moto-newest) instead of
# the pinned one: opt-in, about 5 minutes. make test runs one test there
# (tests/remote_write.rs, the_newest_moto_takes_a_pack_a_seal_and_reads).
test-moto-newest: deps
	SESSIONFS_TEST_MOTO=newest $(CARGO) test --test remote --test remote_write --test remote_mount --test remote_hostile

fmt:
	$(CARGO) fmt --all

fmt-check:
	$(CARGO) fmt --all --check

clippy:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# macOS: cargo check and clippy for both Apple targets (compile only).
apple-check:
	scripts/apple-check.sh

# The Python package (python/) and its Agents SDK integration, in a pinned
# venv of their own (.venv-python; about 1.5 min to make, 1 min to run).
python-test:
	scripts/python-tests.sh

# The unit, unpack, pack, mount and seal tests with the portable paths forced.
fallback-tests:
	scripts/fallback-tests.sh

doc:
	# The internals are the documentation (the crate's outside surface is `api`).
	RUSTDOCFLAGS="-D warnings -A rustdoc::private_intra_doc_links" $(CARGO) doc --workspace --no-deps --document-private-items

schema-check: release
	scripts/check-schema.sh

# The release binary has no test barriers (cargo feature test-hooks, which
# only the tests enable; see src/barrier.rs).
no-test-hooks: release
	! grep -aq SESSIONFS_TEST_BARRIER target/release/sessionfs

# Third-party suites against real mounts: pjdfstest (POSIX) and fsx (I/O).
suites: release
	scripts/suites/pjdfstest.sh
	scripts/suites/fsx.sh

demo: deps release
	scripts/demo.sh

fuzz:
	scripts/fuzz.sh

# The benchmark against tar, fuse-overlayfs, squashfuse_ll, ratarmount and
# archivemount: writes docs/benchmarks.md (about 45 minutes on 2 cores).
bench: release
	scripts/bench/run.sh

# The same code on tiny corpora, so that it cannot rot (part of make test).
bench-quick: release
	QUICK=1 scripts/bench/run.sh

# Copy-up and seal by chunk (issue 33): three rows, about 2 minutes and 4 GiB of disk; part
# of make bench.
bench-chunks: release
	scripts/bench/chunks.sh

bench-pack: release
	scripts/bench/pack.sh

# Remote packets on corpus S behind a shaped stand-in object store, against
# download-then-mount (about 10 minutes). Like bench-pack and bench-many,
# a target of its own: make bench does not run it.
bench-remote: release
	scripts/bench/remote.sh

# Many sessions on one node: 16 mounts of different packets at once, local
# and remote, sharing one node cache (issue 34; about 4 minutes).
bench-many: release
	scripts/bench/many.sh

clean:
	$(CARGO) clean
