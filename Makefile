# sonde: see README.md. `make run` profiles this host; `make test` runs every test.
GO          ?= go
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS     := -X main.version=$(VERSION)
RUN_SECONDS ?= 30

.PHONY: build generate test run bench soak fidelity lint fuzz check-generated clean

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/sonde ./cmd/agent

# Regenerates the BPF objects and their Go bindings with the pinned bpf2go and clang-16.
generate:
	cd bpf && $(GO) generate ./...

# Fails when the committed BPF objects differ from what the sources generate.
check-generated: generate
	git diff --exit-code -- bpf/ || { echo "bpf objects are stale: run 'make generate' and commit"; exit 1; }

# The e2e module builds a real OpenTelemetry Collector, and the deploy module Helm (minutes
# the first time, cached after).
# The packages that sample with BPF (BPF_PACKAGES, and test/e2e) run one package at a time,
# after the others, whose tests would be their noise: cmd/agent's scenarios profile the whole
# host and measure sonde's memory and state before and after. With BUSY=1, as CI runs them,
# each of their test binaries runs beside a CPU hog on one of the two cores (nice 0, like the
# workloads; the compiler before it has the machine to itself), so that a test that needs an
# idle machine or a fast CPU fails there rather than on somebody's busy host.
BPF_PACKAGES := ./bpf ./cmd/agent
BUSY ?=
BUSY_EXEC = $(if $(BUSY),-exec '$(CURDIR)/bin/cpuhog -beside')
test: build image bin/cpuhog
	$(GO) test -count=1 -timeout 20m $$($(GO) list ./... | grep -v -e '/cmd/agent$$' -e '/bpf$$')
	$(GO) test -count=1 -timeout 20m -p 1 $(BUSY_EXEC) $(BPF_PACKAGES)
	cd otelprofiling && $(GO) test -count=1 ./...
	cd test/e2e && $(GO) test -count=1 -timeout 30m $(BUSY_EXEC) ./...
	cd test/deploy && $(GO) test -count=1 -timeout 30m ./...

bin/cpuhog: test/cpuhog/main.go
	$(GO) build -o bin/cpuhog ./test/cpuhog

# The BPF packages and test/e2e alone, beside the CPU hog, as make test BUSY=1 runs them.
.PHONY: test-busy
test-busy: build bin/cpuhog
	$(GO) test -count=1 -timeout 20m -p 1 -exec '$(CURDIR)/bin/cpuhog -beside' $(BPF_PACKAGES)
	cd test/e2e && $(GO) test -count=1 -timeout 30m -exec '$(CURDIR)/bin/cpuhog -beside' ./...

# The long scenarios, whose point is their length: churn for 5 minutes, a 10-minute
# collector outage, the memory limit over 5 minutes (make test runs each for seconds, with
# the same assertions), and Node.js compiling new functions for 10 minutes.
soak: build
	SONDE_SOAK=1 $(GO) test -count=1 -timeout 60m -run 'TestChurn|TestMemoryLimitKept|TestRingOverflow' ./cmd/agent
	cd test/e2e && SONDE_SOAK=1 $(GO) test -count=1 -timeout 60m -run 'TestSondeOutage' ./...
	SONDE_SOAK=1 $(GO) test -count=1 -timeout 60m -run '^$$' -bench 'BenchmarkNodeCompileChurn' -benchtime 1x ./cmd/agent

# Each fuzz target of the file readers, briefly: plain go test already runs their seed
# corpora. Budgets are execution counts (about 10 s each here), not durations: a -fuzztime
# duration races Go's fuzzing coordinator at the deadline and can fail a target with
# "context deadline exceeded" though nothing was found. FUZZTIME=5m overrides them for a
# longer look; FUZZDIV=N divides them (CI's smoke run: FUZZDIV=20, half a second or so each).
FUZZTIME ?=
FUZZDIV ?= 1
FUZZ_TARGETS := ./unwind:FuzzRead:150000x ./symbolize:FuzzELFTable:150000x ./symbolize:FuzzELFTableInPlace:150000x \
	./symbolize:FuzzParseKallsyms:150000x ./symbolize:FuzzUnnamed:50000x \
	./symbolize/dwarf:FuzzTable:500000x ./symbolize/dwarf:FuzzLoad:250000x ./symbolize/dwarf:FuzzInflate:300000x \
	./symbolize/gopclntab:FuzzTable:2000x ./trace:FuzzParseMaps:100000x \
	./internal/objfile:FuzzParseNotes:200000x ./internal/cgroup:FuzzParse:200000x \
	./reporter/folded:FuzzRead:100000x ./reporter/otlp:FuzzDecode:100000x ./reporter/flame:FuzzSVGNames:20000x \
	./tracectx:FuzzParseRecord:200000x ./tracectx:FuzzParseGoLabels:200000x ./tracectx:FuzzParsePayload:100000x \
	./tracectx:FuzzReadProcessContext:100000x ./interp/python:FuzzLines:200000x ./interp/node:FuzzHeap:100000x \
	./interp/jvm:FuzzStreams:200000x ./interp/jvm:FuzzTables:120000x ./interp/jvm:FuzzNamer:70000x ./interp/jvm:FuzzRuntime:150000x
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; rest=$${t#*:}; fn=$${rest%%:*}; n=$${rest#*:}; n=$$(( $${n%x} / $(FUZZDIV) ))x; \
		budget=$(or $(FUZZTIME),$$n); s=$$(date +%s); \
		$(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $$budget -fuzzminimizetime 200x -parallel 2 $$pkg >/tmp/sonde-fuzz.$$$$ 2>&1 || \
			{ cat /tmp/sonde-fuzz.$$$$; rm -f /tmp/sonde-fuzz.$$$$; exit 1; }; \
		rm -f /tmp/sonde-fuzz.$$$$; echo "fuzz $$pkg $$fn $$budget: $$(( $$(date +%s) - s )) s"; \
	done

run: build
	bin/sonde --duration $(RUN_SECONDS)s --output profile.pb.gz --output profile.html
	@echo "flame graph: file://$(CURDIR)/profile.html"

# Every benchmark, once each by default; BENCHTIME=3s (and -count with BENCHFLAGS) for
# figures. docs/performance.md says which benchmark gives which figure.
BENCHTIME ?= 1x
bench: build
	$(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) $(BENCHFLAGS) ./...

# Every benchmark once in its short form (-short: seconds where make bench takes minutes),
# to keep each one working; CI runs this. The figures come from make bench.
.PHONY: bench-smoke
bench-smoke: build
	$(GO) test -run '^$$' -bench . -benchtime 1x -short ./...

# go vet over every module, the arm64 build type-checked too; staticcheck (pinned in
# tools/go.mod, a module of its own so that it never moves sonde's dependencies) over sonde
# and otelprofiling, the code that ships (it analyses every dependency from source: three
# minutes a module on a fresh machine, which the test modules' would triple); gofmt.
lint: bin/staticcheck
	GOARCH=arm64 $(GO) vet ./...
	@set -e; for m in . otelprofiling; do echo "vet, staticcheck: $$m"; \
		(cd $$m && $(GO) vet ./... && $(CURDIR)/bin/staticcheck ./...); done
	cd test/e2e && $(GO) vet ./...
	cd test/fidelity && $(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

bin/staticcheck: tools/go.mod
	cd tools && $(GO) build -o ../bin/staticcheck honnef.co/go/tools/cmd/staticcheck

clean:
	rm -rf bin profile.pb.gz profile.html sonde.html

# sonde against perf record --call-graph dwarf on six real programs (xz, sqlite3, openssl speed,
# CPython, cc1plus, the Go compiler), profiled at once on the same process; rewrites the table of
# docs/fidelity.md. Needs root; installs the programs from Debian where missing. Not part of test.
FIDELITY_PACKAGES := xz-utils sqlite3 openssl gcc g++ linux-perf
FIDELITY_SECONDS  ?= 15
fidelity: build
	@missing=$$(for p in $(FIDELITY_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then echo "installing $$missing"; apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; fi
	cd test/fidelity && $(GO) run . -sonde ../../bin/sonde -duration $(FIDELITY_SECONDS)s -out ../../docs/fidelity.md

# Installs the binary, the systemd unit, its environment file and the default configuration
# (kept if already there). DESTDIR stages into another root, as packagers do.
PREFIX     ?= /usr/local
BINDIR     ?= $(PREFIX)/bin
SYSCONFDIR ?= /etc
UNITDIR    ?= $(PREFIX)/lib/systemd/system
.PHONY: install
install: build
	install -D -m 0755 bin/sonde $(DESTDIR)$(BINDIR)/sonde
	install -d $(DESTDIR)$(UNITDIR)
	sed -e 's|/usr/local/bin/sonde|$(BINDIR)/sonde|' -e 's|/etc/sonde/|$(SYSCONFDIR)/sonde/|g' \
		deploy/systemd/sonde.service > $(DESTDIR)$(UNITDIR)/sonde.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/sonde.service
	install -d -m 0755 $(DESTDIR)$(SYSCONFDIR)/sonde
	test -e $(DESTDIR)$(SYSCONFDIR)/sonde/sonde.yaml || install -m 0644 deploy/sonde.yaml $(DESTDIR)$(SYSCONFDIR)/sonde/sonde.yaml
	test -e $(DESTDIR)$(SYSCONFDIR)/sonde/sonde.env || install -m 0644 deploy/systemd/sonde.env $(DESTDIR)$(SYSCONFDIR)/sonde/sonde.env

# The OCI image, built without a container engine: bin/image (an OCI image layout) and
# bin/sonde-image.tar (for docker load / podman load), holding only bin/sonde.
IMAGE_TAG ?= ghcr.io/sonde-profiler/sonde:$(VERSION)
.PHONY: image
image: build
	cd deploy/image && $(GO) run . -binary ../../bin/sonde -layout ../../bin/image \
		-tar ../../bin/sonde-image.tar -tag '$(IMAGE_TAG)' -version '$(VERSION)'

# The Kubernetes side against a real kube-apiserver and etcd (test/kube): built from Go
# modules the first time (about 7 minutes on two cores, niced) and cached under the user's
# cache directory (SONDE_KUBE_CACHE overrides) by the content of test/kube/server, so
# later runs and CI's clean clones on the same machine only start them.
.PHONY: test-kube
test-kube: build
	cd test/kube && $(GO) test -count=1 -timeout 30m ./...

# Tests of deploy/: the Helm chart (helm built from Go modules), the manifests, the systemd
# unit, the image, and sonde under the capability set it is deployed with (root, in CI).
.PHONY: test-deploy lint-deploy
test-deploy: build image
	cd test/deploy && $(GO) test -count=1 -timeout 30m ./...

lint-deploy:
	cd deploy/image && $(GO) vet ./...
	cd test/deploy && $(GO) vet ./...
	cd test/kube && $(GO) vet ./...
