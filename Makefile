# torpor — see README.md. Every target is safe to re-run.
SHELL := /bin/bash
PREFIX ?= /usr/local
CARGO ?= cargo

.PHONY: all deps deps-demo build install uninstall demo test lint unit-test deploy-test vm-test vm-node-test integration-test bench fuzz clean

all: build

## deps: install (or verify) everything torpor and its tests need; cached under /var/cache/torpor
deps:
	scripts/deps.sh

## deps-demo: only what `make demo` needs (no Kubernetes, promtool, helm or workload images)
deps-demo:
	scripts/deps.sh demo

## build: the shim and the other binaries, release mode
build:
	$(CARGO) build --release --workspace

## install: the shim and torpor-snapshotter on PATH for the system containerd, the
## snapshotter's systemd unit (and an example config, kept if one exists), the config drop-in
install: build
	install -D -m 0755 target/release/containerd-shim-torpor-v1 $(DESTDIR)$(PREFIX)/bin/containerd-shim-torpor-v1
	install -D -m 0755 target/release/torporctl $(DESTDIR)$(PREFIX)/bin/torporctl
	install -D -m 0755 target/release/torpor-snapshotter $(DESTDIR)$(PREFIX)/bin/torpor-snapshotter
	install -D -m 0644 deploy/systemd/torpor-snapshotter.service $(DESTDIR)/etc/systemd/system/torpor-snapshotter.service
	[ -e $(DESTDIR)/etc/torpor/snapshotter.toml ] || install -D -m 0644 deploy/torpor/snapshotter.toml $(DESTDIR)/etc/torpor/snapshotter.toml
	install -D -m 0644 docs/CONFIG.md $(DESTDIR)$(PREFIX)/share/doc/torpor/CONFIG.md
	install -D -m 0644 deploy/containerd/torpor.toml $(DESTDIR)/etc/containerd/conf.d/torpor.toml
	@echo "installed. Make sure /etc/containerd/config.toml has: imports = [\"/etc/containerd/conf.d/*.toml\"]"
	@echo "then: systemctl daemon-reload && systemctl enable --now torpor-snapshotter"
	@echo "      systemctl restart containerd && kubectl apply -f RuntimeClass.yaml"

uninstall:
	rm -f $(DESTDIR)$(PREFIX)/bin/containerd-shim-torpor-v1 $(DESTDIR)$(PREFIX)/bin/torporctl $(DESTDIR)/etc/containerd/conf.d/torpor.toml
	rm -f $(DESTDIR)$(PREFIX)/bin/torpor-snapshotter $(DESTDIR)/etc/systemd/system/torpor-snapshotter.service $(DESTDIR)$(PREFIX)/share/doc/torpor/CONFIG.md
	@echo "kept /etc/torpor/snapshotter.toml and the snapshots under /var/lib/torpor/snapshotter"

## demo: set up the machine, then run an actor under torpor on a private containerd
demo: deps-demo build
	scripts/demo.sh

## test: everything the tests need (make deps: a check when cached), the lints, unit tests,
## the deploy checks, the cgroup v2 guest, then the integration tests against a private containerd
test: deps lint unit-test deploy-test vm-test integration-test

## lint: rustfmt (rustfmt.toml) and clippy on every crate and target, warnings as errors
lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

unit-test:
	$(CARGO) test --release -p torpor-api -p torpor-store -p torpor-runtime -p torpor-shim -p torporctl -p torpor-snapshotter -p torpor-agent
	python3 -m unittest discover -s bench -p 'test_*.py'

## deploy-test: the alerts (promtool check/test rules), the Helm chart with its
## observability values off and on (helm template, lint), the kustomize base
deploy-test:
	test/deploy-checks.sh

## vm-test: the cgroup unit tests and a live cgroup v2 test on a real cgroup v2
## kernel, in a qemu guest (test/vm/run.sh; this host's tree is v1)
vm-test:
	test/vm/run.sh

## vm-node-test: a cgroup v2 node in a qemu guest (test/vm/node.sh): systemd as init,
## containerd + torpor with the systemd and the cgroupfs driver, the integration tests
## that prove that configuration; results in target/vm-node. Not yet in `make test`
## (about 10 min under emulation; all checks passed once: test/vm/README.md, Measured)
vm-node-test:
	test/vm/node.sh

integration-test:
	test/rig/run-tests.sh

## fuzz: each cargo-fuzz target for FUZZ_SECONDS (fuzz/run.sh; FUZZ_TARGETS to pick);
## new corpus entries land in fuzz/corpus/<target>, crashers in fuzz/artifacts/<target>
FUZZ_SECONDS ?= 60
fuzz:
	FUZZ_SECONDS=$(FUZZ_SECONDS) fuzz/run.sh

## bench: torpor against containerd-shim-runc-v2, writes bench/results.json and BENCHMARKS.md
bench: build
	bench/run.sh

clean:
	$(CARGO) clean
