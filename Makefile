# Tollgate: `make run` (demo) and `make test` (everything CI checks).
CARGO ?= cargo
SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
# command:debian-package pairs
BUILD_DEPS := cmake:cmake cc:gcc pkg-config:pkg-config /usr/include/openssl/ssl.h:libssl-dev openssl:openssl /usr/share/zoneinfo/Europe/Berlin:tzdata
TEST_DEPS  := kubectl:kubectl promtool:prometheus redis-server:redis-server redis-cli:redis-tools redis-sentinel:redis-sentinel wrk:wrk curl:curl chromium:chromium /usr/sbin/dnsmasq:dnsmasq-base
BENCH_DEPS := wrk:wrk nginx:nginx h2load:nghttp2-client /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1:libfaketime
DEB_DEPS   := dpkg-shlibdeps:dpkg-dev adduser:adduser curl:curl
# the package under a real systemd in a container (scripts/deb-systemd-check)
DEB_CHECK_DEPS := systemd-nspawn:systemd-container systemctl:systemd nsenter:util-linux wrk:wrk

.PHONY: all deps deps-test deps-bench build release run test conformance lint fmt bench check-configs clean demo-cert fuzz deb deb-check image image-check

all: build

deps:
	@scripts/ensure-packages $(BUILD_DEPS)

deps-test: deps
	@scripts/ensure-packages $(TEST_DEPS)
	@scripts/test-venv

deps-bench: deps
	@scripts/ensure-packages $(BENCH_DEPS)

build: deps
	$(CARGO) build --bins --examples

release: deps
	$(CARGO) build --release --bins --examples

## The demo's self-signed certificate for localhost, under target/ (conf/gateway.yaml uses it).
demo-cert: deps
	@scripts/demo-cert

## Build, start the demo upstreams and run the gateway on conf/gateway.yaml (no Redis needed):
## HTTP/1.1 and h2c on 8080, HTTPS with HTTP/2 on 8443, a gRPC upstream on 9004.
run: release demo-cert
	scripts/run-demo

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## Lints, then every unit and integration test (real gateway, upstreams and redis-server),
## then, on the release build, the fleet simulation (thousands of seeds), the fleet under
## wrk load, Redis Cluster under faults and a Sentinel failover. The integration tests run the example upstream,
## so examples are built first.
test: deps-test demo-cert lint
	$(CARGO) build --examples
	$(CARGO) build --release --bins --examples
	$(CARGO) test --workspace --lib --bins --tests 2>&1 | tee target/test.log
	$(CARGO) test --release --test fleet_sim --test fleet_load --test cluster --test sentinel 2>&1 | tee -a target/test.log
	@awk '/^test result:/ { p += $$4; f += $$6 } END { printf "tests: %d passed, %d failed\n", p, f }' target/test.log

## Outside test suites against a real gateway (CI runs it after `make test`): sslyze with
## Mozilla's intermediate profile, promtool on /metrics, h2load over h2 and h2c with request
## bodies, a WebSocket echo past max_body_bytes (the `websockets` package), every RateLimit
## value through http_sfv, and the raw-socket smuggling table. Installs h2load and promtool
## from Debian and the Python packages into target/conformance-venv.
conformance: deps
	scripts/conformance

## Criterion benchmark of the decision; the cost per request against a bare Pingora
## passthrough (callgrind instructions, wrk throughput, latency, nginx + limit_req); the whole
## gateway under wrk (rules vs no rules); the fleet's accuracy and the seed scenario of three
## instances sharing limits through Redis, and one ledger script call's instructions in Redis
## (callgrind); HTTP/2 over TLS next to nginx (h2load); unary gRPC
## over h2c direct, through the gateway (no rules, 3 rules) and through nginx grpc_pass
## (h2load, callgrind, connections to the server); the tenant from an API key or a signed token
## (cached, uncached); memory under a million tenant ids; fleet sizing (what 3, 10 and 12
## instances ask of Redis at 1,000 and 10,000 requests/s, a failover behind one endpoint, clock
## skew, restarts in a monthly window). Tables and charts go to BENCHMARKS.md.
bench: deps-bench deps-test release
	$(CARGO) bench --bench decision
	scripts/bench-cost
	scripts/bench-gateway
	scripts/bench-edge
	scripts/bench-grpc
	scripts/bench-tokens
	scripts/bench-memory
	scripts/bench-fleet
	scripts/bench-script-cost
	scripts/bench-fleet-sizing

## The Debian package, target/debian/tollgate_<version>_<arch>.deb (cargo-deb, installed if
## missing; see [package.metadata.deb] in Cargo.toml), and what CI checks of it (as root):
## install it with dpkg, check and run the config it installed, send a request, purge it; then
## the same under a real systemd booted in a container (systemd-nspawn): start, reload, an
## upgrade to a newer package under traffic with no request lost, remove, purge.
deb: deps
	@scripts/ensure-packages $(DEB_DEPS)
	@command -v cargo-deb >/dev/null || $(CARGO) install cargo-deb --locked
	$(CARGO) build --release --bins --examples
	$(CARGO) deb --no-build --strip

deb-check: deb
	@scripts/ensure-packages $(DEB_CHECK_DEPS)
	scripts/deb-check
	scripts/deb-systemd-check

## The OCI image, target/image/oci (an image layout) and target/image/tollgate-<version>.oci.tar,
## built without a container daemon (umoci): the release binary, its libraries, CA certificates,
## time zones, the default config (packaging/image/gateway.yaml); non-root, no shell,
## reproducible (SOURCE_DATE_EPOCH, default: the last commit's time).
image: release
	scripts/image

## The image built twice (one digest), its size, user, entrypoint and labels, then unpacked and
## run as an OCI bundle under systemd-nspawn: /readyz and a request through it (CI runs it).
image-check: image
	scripts/image-check

## Coverage-guided fuzzing (fuzz/, cargo-fuzz and libFuzzer) of the config loader, path
## normalization and globs, X-Forwarded-For, durations, partition keys and bearer tokens,
## FUZZ_SECONDS each.
## cargo-fuzz needs a nightly toolchain (or RUSTC_BOOTSTRAP=1 on stable, as used here).
FUZZ_SECONDS ?= 60
fuzz: deps
	@command -v cargo-fuzz >/dev/null || $(CARGO) install cargo-fuzz --locked
	@for t in config path xff duration partition token; do \
	  echo "== fuzz $$t ($(FUZZ_SECONDS) s)"; \
	  RUSTC_BOOTSTRAP=1 $(CARGO) fuzz run --fuzz-dir fuzz $$t -- -max_total_time=$(FUZZ_SECONDS) 2>&1 | tail -3 || exit 1; \
	done

check-configs: build demo-cert
	@for f in conf/*.yaml; do if grep -q '^server:' $$f; then target/debug/tollgate -t -c $$f >/dev/null && echo "ok $$f"; fi; done

fmt:
	$(CARGO) fmt --all

clean:
	$(CARGO) clean
