# sessionfs. `make test` is what CI runs (.ci/run); `make check` adds docs.
SHELL := /bin/bash
CARGO ?= cargo
export CARGO_TERM_COLOR ?= never

# Third-party suites are installed by their scripts when missing.
.PHONY: suites build release deps test unit check fmt fmt-check clippy doc demo bench bench-pack bench-quick fuzz schema-check clean

build:
	$(CARGO) build --all-targets

release:
	$(CARGO) build --release

deps:
	scripts/deps.sh

test: deps fmt-check clippy
	SESSIONFS_REQUIRE_FUSE=1 $(CARGO) test --all-targets
	$(MAKE) schema-check suites demo
	FUZZ_SECONDS=$${FUZZ_SECONDS:-15} scripts/fuzz.sh

check: test doc

fmt:
	$(CARGO) fmt

fmt-check:
	$(CARGO) fmt --check

clippy:
	$(CARGO) clippy --all-targets -- -D warnings

doc:
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps

schema-check: release
	scripts/check-schema.sh

# Third-party suites against real mounts: pjdfstest (POSIX) and fsx (I/O).
suites: release
	scripts/suites/pjdfstest.sh
	scripts/suites/fsx.sh

demo: release
	scripts/demo.sh

fuzz:
	scripts/fuzz.sh

bench-pack: release
	$(CARGO) build --release --bin sessionfs-bench
	scripts/bench/pack.sh

clean:
	$(CARGO) clean
