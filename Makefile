# vipcast — the two README commands live here: `make lab` (a whole vipcast
# installation on this machine) and `make test` (every test tier, against real
# components). Every target installs what it needs itself.

SHELL := /bin/bash
GO ?= go
K8S_VERSION := v1.37.1
CONTAINERD_VERSION := v2.4.2
HELM_VERSION := v3.22.0
VIPCAST_CACHE ?= $(HOME)/.cache/vipcast
export VIPCAST_CACHE
K8S_BIN := $(VIPCAST_CACHE)/k8s-$(K8S_VERSION)
CONTAINERD_BIN := $(VIPCAST_CACHE)/containerd-$(CONTAINERD_VERSION)
HELM_BIN := $(VIPCAST_CACHE)/helm-$(HELM_VERSION)
# The OCI registry the lab pushes its release to (distribution's reference
# registry); keep equal to the requirement in test/tools/registry/go.mod.
REGISTRY_VERSION := v3.1.2
REGISTRY_BIN := $(VIPCAST_CACHE)/registry-$(REGISTRY_VERSION)
# CoreDNS: keep equal to the requirement in test/tools/coredns/go.mod.
COREDNS_VERSION := v1.15.0
COREDNS_BIN := $(VIPCAST_CACHE)/coredns-$(COREDNS_VERSION)
K8S_MAJOR := $(patsubst v%,%,$(word 1,$(subst ., ,$(K8S_VERSION))))
K8S_MINOR := $(word 2,$(subst ., ,$(K8S_VERSION)))
K8S_LDFLAGS := -s -w \
	-X k8s.io/component-base/version.gitVersion=$(K8S_VERSION) \
	-X k8s.io/component-base/version.gitMajor=$(K8S_MAJOR) \
	-X k8s.io/component-base/version.gitMinor=$(K8S_MINOR)
BIN := bin
# Image tag and reproducible timestamps come from git.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
export SOURCE_DATE_EPOCH
# Every binary and test binary is static, built in one configuration: the
# VMs need static binaries, a static test binary boots in a VM as it is
# (test/vm), and one configuration lets the Kubernetes binaries share their
# compiled packages (with kube-apiserver built with cgo and the kubelet
# without, the kubelet's cold build took 13 minutes after kube-apiserver's,
# compiling again most of what kube-apiserver had compiled).
export CGO_ENABLED := 0
# Test timeouts, per package: test/lab (the real cluster)
# took 19 to 28 minutes on 2 cores, and 30 cut it short on a loaded host.
TEST_TIMEOUT ?= 60m
# The test tiers beyond the unit tier, as build tags: a _test.go file with no
# tag needs nothing but Go (make test-unit); the others carry exactly one of
# these (docs/dev/development.md, Test tiers), and make test runs them all.
TEST_TAGS := controlplane,routing,kernel,lab
# The packages with test files of a tier (its build tag), for make test-TIER.
tier_pkgs = $(sort $(dir $(shell grep -rlE --include='*_test.go' --exclude-dir=hack --exclude-dir=_output '^//go:build .*\<$(1)\>' .)))
# golangci-lint, built from its Go module into the cache once per version
# (~3 min on 2 cores); .golangci.yml says what it checks.
GOLANGCI_LINT_VERSION := v2.15.0
GOLANGCI_LINT_DIR := $(abspath $(VIPCAST_CACHE))/golangci-lint-$(GOLANGCI_LINT_VERSION)
GOLANGCI_LINT := $(GOLANGCI_LINT_DIR)/golangci-lint

.PHONY: all build images release e2e-tools test-upstream test test-unit test-controlplane test-routing test-kernel test-lab bench generate verify tools cluster-tools routers lab lab-root lab-down lint fuzz model clean help

all: build

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

build: ## build bin/vipcast-ccm, bin/vipcast-speaker and bin/kubectl-vipcast (the kubectl plugin)
	$(GO) build -o $(BIN)/ ./cmd/...

images: ## container images without a Docker daemon: _output/images/vipcast-{ccm,speaker}.tar (docker load / skopeo)
	@mkdir -p _output/image-bin _output/images
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w' -o _output/image-bin/ ./cmd/...
	$(GO) -C hack/image run . -tag $(VERSION) -outdir $(CURDIR)/_output/images $(CURDIR)/_output/image-bin/vipcast-ccm $(CURDIR)/_output/image-bin/vipcast-speaker

# Real routers for the routing tier: FRR and BIRD from Debian, installed
# once (never configured as system services: the tests run their own).
ROUTER_BINS := /usr/lib/frr/bgpd /usr/lib/frr/zebra /usr/bin/vtysh /usr/sbin/bird /usr/sbin/birdc
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
routers: ## install FRR, BIRD and iproute2 from Debian when missing
	@for b in $(ROUTER_BINS) $$(command -v ip || echo /sbin/ip); do [ -x $$b ] || missing=1; done; \
	if [ -n "$$missing" ]; then \
		echo ">> installing frr bird2 iproute2 (apt-get, first time only)"; \
		$(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends frr bird2 iproute2 >/dev/null; \
	fi

# kube-apiserver and etcd, built from Go modules (test/tools) into a cache
# keyed by the Kubernetes version: the first build takes ~12 min on 2 cores,
# every later run reuses it.
tools: $(K8S_BIN)/kube-apiserver $(K8S_BIN)/etcd $(K8S_BIN)/kubectl ## build the control-plane binaries and kubectl into the cache

$(K8S_BIN)/kube-apiserver:
	@mkdir -p $(K8S_BIN)
	@echo ">> building kube-apiserver $(K8S_VERSION) into $(K8S_BIN) (first time only, ~10 min)"
	cd test/tools && ../../hack/progress.sh "building kube-apiserver" $(GO) build -trimpath -ldflags '$(K8S_LDFLAGS)' -o $@.tmp k8s.io/kubernetes/cmd/kube-apiserver && mv $@.tmp $@

$(K8S_BIN)/etcd:
	@mkdir -p $(K8S_BIN)
	@echo ">> building etcd into $(K8S_BIN) (first time only)"
	cd test/tools && ../../hack/progress.sh "building etcd" $(GO) build -trimpath -ldflags '-s -w' -o $@.tmp go.etcd.io/etcd/server/v3 && mv $@.tmp $@

# What a real cluster needs on top of `make tools`: kubelet, kube-proxy,
# kube-controller-manager and kube-scheduler (test/tools), containerd
# (test/tools/containerd) and helm (test/tools/helm), each built from its Go
# module into a cache keyed by its version. Static (CGO_ENABLED=0): the node
# binaries run inside Debian VMs.
# The times are first builds on 2 cores, in this order, after `make tools`
# (kube-proxy and kube-scheduler reuse what kubelet and kube-controller-manager
# compiled).
cluster-tools: $(addprefix $(K8S_BIN)/,kubelet kube-controller-manager kube-proxy kube-scheduler) $(addprefix $(CONTAINERD_BIN)/,containerd ctr containerd-shim-runc-v2) $(HELM_BIN)/helm $(REGISTRY_BIN)/registry ## build kubelet, kube-proxy, kube-controller-manager, kube-scheduler, containerd, helm and the OCI registry into the cache

$(K8S_BIN)/kubelet: BUILD_TIME := ~4 min
$(K8S_BIN)/kube-controller-manager: BUILD_TIME := ~2.5 min
$(K8S_BIN)/kube-proxy: BUILD_TIME := ~10 s
$(K8S_BIN)/kube-scheduler: BUILD_TIME := ~10 s
$(K8S_BIN)/kubelet $(K8S_BIN)/kube-controller-manager $(K8S_BIN)/kube-proxy $(K8S_BIN)/kube-scheduler: $(K8S_BIN)/%:
	@mkdir -p $(K8S_BIN)
	@echo ">> building $* $(K8S_VERSION) into $(K8S_BIN) (first time only, $(BUILD_TIME))"
	cd test/tools && CGO_ENABLED=0 ../../hack/progress.sh "building $*" $(GO) build -trimpath -ldflags '$(K8S_LDFLAGS)' -o $@.tmp k8s.io/kubernetes/cmd/$* && mv $@.tmp $@

# containerd's own Makefile sets version.Version the same way; the tags leave
# out the snapshotters a test node does not use (btrfs needs cgo anyway; aufs
# is gone from containerd 2, its tag is kept for older versions).
CONTAINERD_TAGS := no_btrfs no_devmapper no_zfs no_aufs
CONTAINERD_LDFLAGS := -s -w \
	-X github.com/containerd/containerd/v2/version.Version=$(CONTAINERD_VERSION)
$(CONTAINERD_BIN)/containerd: BUILD_TIME := ~1 min
$(CONTAINERD_BIN)/ctr: BUILD_TIME := ~5 s
$(CONTAINERD_BIN)/containerd-shim-runc-v2: BUILD_TIME := ~5 s
$(CONTAINERD_BIN)/containerd $(CONTAINERD_BIN)/ctr $(CONTAINERD_BIN)/containerd-shim-runc-v2: $(CONTAINERD_BIN)/%:
	@mkdir -p $(CONTAINERD_BIN)
	@echo ">> building $* $(CONTAINERD_VERSION) into $(CONTAINERD_BIN) (first time only, $(BUILD_TIME))"
	cd test/tools/containerd && CGO_ENABLED=0 ../../../hack/progress.sh "building $*" $(GO) build -trimpath -tags '$(CONTAINERD_TAGS)' -ldflags '$(CONTAINERD_LDFLAGS)' -o $@.tmp github.com/containerd/containerd/v2/cmd/$* && mv $@.tmp $@

# helm's own Makefile sets the version and the Kubernetes version that
# `helm template` and `helm lint` assume without a cluster (Capabilities,
# the chart's kubeVersion constraint): here the cluster's, K8S_VERSION.
HELM_LDFLAGS := -s -w \
	-X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION) \
	-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=$(K8S_MAJOR) \
	-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$(K8S_MINOR) \
	-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=$(K8S_MAJOR) \
	-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$(K8S_MINOR)
$(HELM_BIN)/helm:
	@mkdir -p $(HELM_BIN)
	@echo ">> building helm $(HELM_VERSION) into $(HELM_BIN) (first time only, ~2 min)"
	cd test/tools/helm && CGO_ENABLED=0 ../../../hack/progress.sh "building helm" $(GO) build -trimpath -ldflags '$(HELM_LDFLAGS)' -o $@.tmp helm.sh/helm/v3/cmd/helm && mv $@.tmp $@

$(REGISTRY_BIN)/registry:
	@mkdir -p $(REGISTRY_BIN)
	@echo ">> building the OCI registry (distribution $(REGISTRY_VERSION)) into $(REGISTRY_BIN) (first time only, ~2 min)"
	cd test/tools/registry && CGO_ENABLED=0 ../../../hack/progress.sh "building registry" $(GO) build -trimpath -ldflags '-s -w -X github.com/distribution/distribution/v3/version.version=$(REGISTRY_VERSION)' -o $@.tmp github.com/distribution/distribution/v3/cmd/registry && mv $@.tmp $@

# REGISTRY=HOST[:PORT]/PATH and VERSION=MAJOR.MINOR.PATCH are required;
# IMAGE_REGISTRY, PLAIN_HTTP and RELEASE_DIR: see hack/release.sh.
release: $(HELM_BIN)/helm ## build and push a release to REGISTRY: both images for linux/amd64 and linux/arm64 (one OCI index each), the chart as an OCI artifact, SHA256SUMS (make release REGISTRY=host[:port]/path VERSION=x.y.z)
	VERSION=$(VERSION) HELM=$(HELM_BIN)/helm hack/release.sh

generate: ## regenerate deepcopy code, CRD manifests and the reference pages of docs/reference
	hack/generate.sh

# Every module of the repository; make verify fails when go mod tidy would
# change the go.mod or go.sum of any of them.
GO_MODULES := . hack/image test/tools test/tools/e2e test/tools/coredns test/tools/containerd test/tools/helm test/tools/registry

verify: $(GOLANGCI_LINT) ## gofmt, go vet, go mod tidy, golangci-lint, generated files (code, CRDs, reference pages) up to date
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@big=$$(git ls-files -z | xargs -0 -r stat -c '%s %n' 2>/dev/null | awk '$$1 > 2000000 {print "  " $$2 " (" $$1 " bytes)"}'); \
		if [ -n "$$big" ]; then echo "files over 2 MB in git (a go build leftover? add it to .gitignore and git rm --cached it):"; echo "$$big"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags $(TEST_TAGS) ./...
	$(GO) -C hack/image vet ./...
	$(GO) -C test/tools/coredns vet -trimpath ./...
	@for m in $(GO_MODULES); do \
		echo "$(GO) -C $$m mod tidy -diff"; \
		diff=$$($(GO) -C $$m mod tidy -diff) && continue; \
		if [ -n "$$diff" ]; then \
			echo "$$diff"; \
			echo "$$m: go.mod/go.sum are not tidy; run: (cd $$m && go mod tidy)"; \
		else \
			echo "$$m: go mod tidy -diff failed (see above)"; \
		fi; \
		exit 1; \
	done
	@$(MAKE) --no-print-directory lint
	hack/verify-generate.sh

lint: $(GOLANGCI_LINT) ## golangci-lint over the root module and hack/image (test/tools and its submodules have no Go code)
	$(GOLANGCI_LINT) run ./...
	cd hack/image && $(GOLANGCI_LINT) run --config $(CURDIR)/.golangci.yml ./...

$(GOLANGCI_LINT):
	@mkdir -p $(GOLANGCI_LINT_DIR)
	@echo ">> building golangci-lint $(GOLANGCI_LINT_VERSION) into $(GOLANGCI_LINT_DIR) (first time only, ~3 min)"
	GOBIN=$(GOLANGCI_LINT_DIR)/tmp hack/progress.sh "building golangci-lint" $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION) && mv $(GOLANGCI_LINT_DIR)/tmp/golangci-lint $@ && rmdir $(GOLANGCI_LINT_DIR)/tmp

test-unit: ## every test that needs nothing but Go (no build tag): no root, API server, router, VM or cached binary
	$(GO) test -count=1 ./...

test-controlplane: tools ## (tag controlplane) against a real kube-apiserver + etcd: vipcast-ccm, the CRDs, the chart applied
	@mkdir -p _output
	$(GO) test -tags controlplane -count=1 -timeout $(TEST_TIMEOUT) -v $(call tier_pkgs,controlplane) 2>&1 | tee _output/controlplane-test.log | grep -E '^(=== RUN|--- |PASS|FAIL|ok|panic)|_test.go:' ; exit $${PIPESTATUS[0]}

test-routing: routers tools ## (tag routing) bgp/ and vipcast-speaker against real FRR and BIRD (loopback and, as root, network namespaces)
	@mkdir -p _output
	$(GO) test -tags routing -count=1 -timeout $(TEST_TIMEOUT) -v $(call tier_pkgs,routing) 2>&1 | tee _output/routing-test.log | grep -E '^(=== RUN|--- |PASS|FAIL|ok|panic)|_test.go:' ; exit $${PIPESTATUS[0]}

test-kernel: ## (tag kernel) the dataplane in Debian's kernel under qemu: ipvs/, the speaker's controller, test/vm
	$(GO) test -tags kernel -count=1 -timeout $(TEST_TIMEOUT) $(call tier_pkgs,kernel)

test-lab: lab-root tools cluster-tools e2e-tools routers $(K8S_BIN)/kubectl ## (tag lab, as root) test/lab: every cluster-level scenario in one real cluster
	@mkdir -p _output
	$(GO) test -tags lab -count=1 -timeout $(TEST_TIMEOUT) -v $(call tier_pkgs,lab) 2>&1 | tee _output/lab-test.log | grep -E '^(=== RUN|--- |PASS|FAIL|ok|panic)|_test.go:' ; exit $${PIPESTATUS[0]}

test-upstream: ## make test-lab with the whole LoadBalancer focus of Kubernetes' e2e suite in its upstream scenario, instead of the part make test runs (~50 min more: three specs take 11-14 min each)
	VIPCAST_UPSTREAM_FULL=1 $(MAKE) test-lab TEST_TIMEOUT=150m

# hack/testreport prints what plain go test prints, keeps the verbose log in
# _output/test.log and the events in _output/test.json, and ends with a failure
# summary, the skipped tests and a table of wall times. It fails the run when
# the tests take longer than TEST_MAX_TOTAL (default 60m) and, with CI=true,
# when any test skipped. test/lab runs last, alone: its VMs run at nice 10
# (test/vm), so that the API servers, routers and speakers that other tests
# time get the CPU when they need it; beside test/e2e's busiest tests they got
# so little that a kube-proxy restart in a node VM timed out, and at nice 0
# beside test/lab a 100 ms BFD session in test/e2e went down. (The real
# cluster's control plane runs at nice 10 too, as an equal of its VMs.) The
# other packages run FIRST_PARALLEL at a time, the longest first (FIRST_PKGS:
# go test starts packages in the order it is given them), so that test/e2e,
# the CCM's model test (test/ccmmodel, which mostly waits on the CCM) and
# the kernel tier overlap each other and the rest rather than follow them;
# with two at a time and the model test inside test/e2e, the packages took
# ~10.5 min, with three ~8.5.
LAB_PKGS := ./test/lab/...
FIRST_PKGS := ./test/e2e ./test/ccmmodel ./ipvs ./bgp ./test/chart ./speaker ./test/vm
FIRST_PARALLEL := 3
test: verify tools cluster-tools e2e-tools routers ## everything: unit, control-plane, routing, dataplane (VM) and real-cluster tiers, and the image builder
	@mkdir -p _output
	$(GO) -C hack/image test -count=1 ./...
	$(GO) build -o _output/testreport ./hack/testreport
	( $(GO) test -tags $(TEST_TAGS) -json -count=1 -p $(FIRST_PARALLEL) -timeout $(TEST_TIMEOUT) $$($(GO) list -tags $(TEST_TAGS) $(FIRST_PKGS) ./... | grep -v '/test/lab\(/\|$$\)'); a=$$?; \
	  $(GO) test -tags $(TEST_TAGS) -json -count=1 -timeout $(TEST_TIMEOUT) $(LAB_PKGS); b=$$?; exit $$(( a | b )) ) 2>&1 | _output/testreport -out _output $(if $(filter true,$(CI)),-fail-on-skip); \
		rc=("$${PIPESTATUS[@]}"); if [ $${rc[0]} != 0 ] && [ $${rc[1]} = 0 ]; then echo "FAIL: go test exited with status $${rc[0]}"; fi; \
		[ $${rc[0]} = 0 ] && [ $${rc[1]} = 0 ]

# Every fuzz target of the repository, as package:target; go test runs
# their seeds, make fuzz explores each for FUZZTIME.
FUZZ_TARGETS := \
	./bfd/:FuzzUnmarshal \
	./ipam/:FuzzAllocator \
	./ipam/:FuzzParseAddresses \
	./poolspec/:FuzzAdmit \
	./api/v1alpha1/:FuzzBGPPeerSpecCheck \
	./ccm/:FuzzRequestFor \
	./ipvs/:FuzzDiff \
	./ipvs/:FuzzCheckSyncMessage \
	./ipvs/:FuzzFilterSyncMessage \
	./metallbimport/:FuzzTranslate \
	./speaker/:FuzzNodeFrom \
	./speaker/:FuzzPeersForNode \
	./speaker/:FuzzCompile \
	./speaker/:FuzzRouteTable \
	./speaker/:FuzzServiceDataplane

# The randomized model test of vipcast-ccm (test/ccmmodel TestCCMModel): make test
# runs 200 steps with a seed from the clock; this runs more, or replays one.
MODEL_STEPS ?= 2000
MODEL_SEED ?= 0
model: tools ## TestCCMModel for MODEL_STEPS steps (default 2000) from MODEL_SEED (0: the clock)
	$(GO) test -tags controlplane -count=1 -timeout 4h -run '^TestCCMModel$$' -v ./test/ccmmodel/ -args -vipcast.model-steps=$(MODEL_STEPS) -vipcast.model-seed=$(MODEL_SEED) 2>&1 | grep -E '^(=== RUN|--- |PASS|FAIL|ok)|model_test.go' ; exit $${PIPESTATUS[0]}

fuzz: ## run every fuzz target for a while each (FUZZTIME=60s)
	@set -e; for t in $(FUZZ_TARGETS); do \
		echo "$(GO) test -run '^$$' -fuzz '^$${t#*:}$$' -fuzztime $${FUZZTIME:-60s} $${t%%:*}"; \
		$(GO) test -run '^$$' -fuzz "^$${t#*:}$$" -fuzztime $${FUZZTIME:-60s} $${t%%:*}; \
	done

# make bench keeps each benchmark's output in _output/bench-*.txt and, once
# all have passed, writes docs/dev/performance.md from them (hack/benchreport,
# its prose in hack/benchreport/performance.md.tmpl): a benchmark that fails
# stops make (pipefail: go test's status, not grep's), so no page is written
# from a partial run. The commit and the day measured are taken when make
# starts, the run taking an hour; -dirty marks a tree with changes besides
# the page itself.
bench: private .SHELLFLAGS := -o pipefail -c
bench: private BENCH_COMMIT := $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)$(shell git diff --quiet HEAD -- . ':(exclude)docs/dev/performance.md' 2>/dev/null || echo -dirty)
bench: private BENCH_DATE := $(shell date -u +%F)
bench: tools routers $(K8S_BIN)/kube-proxy ## run the ipam, CCM, speaker, scale (against kube-proxy), dataplane (one tier and two), BFD and test-VM benchmarks, then write docs/dev/performance.md from their outputs
	@mkdir -p _output
	$(GO) test -run '^$$' -bench . -benchmem -count 1 ./ipam/ ./poolspec/ ./speaker/ ./bfd/ | tee _output/bench-ipam.txt
	$(GO) test -tags controlplane -count=1 -timeout 30m -run '^$$' -bench BenchmarkCCMAllocation -benchtime 1x ./test/e2e/ 2>&1 | tee _output/bench-ccm.txt | grep -E 'BENCH|^Benchmark|^ok|FAIL'
	$(GO) test -tags routing -count=1 -timeout 10m -run '^$$' -bench BenchmarkAnnounce10k -benchtime 3x ./bgp/ 2>&1 | tee _output/bench-bgp.txt | grep -E '^Benchmark|^ok|FAIL'
	$(GO) test -tags routing -count=1 -timeout 30m -run '^$$' -bench BenchmarkSpeakerAnnounce -benchtime 1x ./test/e2e/ 2>&1 | tee _output/bench-speaker.txt | grep -E 'BENCH|^Benchmark|^ok|FAIL'
	$(GO) test -tags routing -count=1 -timeout 60m -run '^$$' -bench BenchmarkScale -benchtime 1x ./test/e2e/ 2>&1 | tee _output/bench-scale.txt | grep -E 'BENCH|^ok|FAIL'
	$(GO) test -count=1 -run '^$$' -bench 'BenchmarkDiff|BenchmarkRelayCheck' -benchmem ./ipvs/ | tee _output/bench-ipvs-diff.txt
	$(GO) test -tags kernel -count=1 -timeout 30m -run '^$$' -bench BenchmarkKernelDataplane -benchtime 1x ./ipvs/ 2>&1 | tee _output/bench-ipvs.txt | grep -E '^Benchmark|^ok|FAIL'
	$(GO) test -tags kernel -count=1 -timeout 10m -run '^$$' -bench BenchmarkTwoTier -benchtime 1x ./ipvs/ 2>&1 | tee _output/bench-twotier.txt | grep -E '^Benchmark|^ok|FAIL'
	$(GO) test -tags kernel -count=1 -timeout 10m -run '^$$' -bench BenchmarkGuestCopy -benchtime 1x ./test/vm/ 2>&1 | tee _output/bench-guest-copy.txt | grep -E '^Benchmark|^ok|FAIL'
	$(GO) test -tags routing -count=1 -timeout 30m -run '^TestSpeakerFabric(BFD)?$$' -v ./test/e2e/ -args -bfd-trials=50 2>&1 | tee _output/bench-bfd.txt | grep -E 'frozen|SIGSTOP|thawed|^--- |^ok|FAIL'
	$(GO) run ./hack/benchreport -commit $(BENCH_COMMIT) -date $(BENCH_DATE) -o docs/dev/performance.md _output/bench-*.txt

$(K8S_BIN)/kubectl:
	@mkdir -p $(K8S_BIN)
	@echo ">> building kubectl $(K8S_VERSION) into $(K8S_BIN) (first time only)"
	cd test/tools && ../../hack/progress.sh "building kubectl" $(GO) build -trimpath -ldflags '$(K8S_LDFLAGS)' -o $@.tmp k8s.io/kubernetes/cmd/kubectl && mv $@.tmp $@

# Kubernetes' own e2e suite at K8S_VERSION (test/tools/e2e: upstream's
# driver with SIG Network's specs, where the LoadBalancer specs live),
# agnhost, the image its specs run, and CoreDNS (test/tools/coredns: the
# specs reach Services by name), built from their Go source into the
# cache; the lab imports agnhost into the nodes under upstream's name, on
# a userland of this machine's Debian (bash, curl, netcat-openbsd,
# iproute2: installed here when missing).
e2e-tools: $(K8S_BIN)/e2e.test $(K8S_BIN)/agnhost $(COREDNS_BIN)/coredns ## build Kubernetes' e2e.test (network specs), agnhost and CoreDNS into the cache
	@command -v nc.openbsd >/dev/null && command -v wget >/dev/null || { echo ">> installing netcat-openbsd (apt-get, first time only): agnhost's nc"; \
		$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends netcat-openbsd curl wget bash iproute2 >/dev/null; }

$(K8S_BIN)/e2e.test:
	@mkdir -p $(K8S_BIN)
	@echo ">> building e2e.test $(K8S_VERSION) into $(K8S_BIN) (first time only, ~8 min)"
	cd test/tools/e2e && ../../../hack/progress.sh "building e2e.test" $(GO) test -c -vet=off -trimpath -ldflags '$(K8S_LDFLAGS)' -o $@.tmp . && mv $@.tmp $@

$(K8S_BIN)/agnhost:
	@mkdir -p $(K8S_BIN)
	@echo ">> building agnhost (k8s.io/kubernetes $(K8S_VERSION)) into $(K8S_BIN) (first time only)"
	cd test/tools/e2e && ../../../hack/progress.sh "building agnhost" $(GO) build -trimpath -ldflags '-s -w' -o $@.tmp k8s.io/kubernetes/test/images/agnhost && mv $@.tmp $@

$(COREDNS_BIN)/coredns:
	@mkdir -p $(COREDNS_BIN)
	@echo ">> building CoreDNS $(COREDNS_VERSION) into $(COREDNS_BIN) (first time only)"
	cd test/tools/coredns && ../../../hack/progress.sh "building coredns" $(GO) build -trimpath -ldflags '-s -w' -o $@.tmp . && mv $@.tmp $@

lab-root:
	@[ "$$(id -u)" = 0 ] || { echo "make lab needs root: it creates network namespaces, tap devices and VMs. Run it as root."; exit 1; }

# LAB_FLAGS: -proxy-mode nftables|ipvs; -upstream for Kubernetes' e2e suite
# (docs/dev/testing.md).
LAB_FLAGS ?=
lab: lab-root tools cluster-tools routers $(K8S_BIN)/kubectl $(if $(findstring -upstream,$(LAB_FLAGS)),e2e-tools) ## as root: a real cluster (control plane, 2 node VMs with kubelet, containerd, kube-proxy), vipcast by helm install, an FRR ToR and a client; Ctrl-C tears down
	@mkdir -p _output
	$(GO) build -o _output/ ./test/lab/cmd/lab ./cmd/kubectl-vipcast
	_output/lab up -dir _output/lab-run $(LAB_FLAGS)

lab-down: ## stop a running `make lab` (from another terminal) and remove its leftovers
	$(GO) run ./test/lab/cmd/lab down -dir _output/lab-run

clean:
	rm -rf $(BIN) _output
