# student-bridge: every developer and CI entry point. `make help` lists them.

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec
.DEFAULT_GOAL := help

ROOT    := $(abspath .)
BIN     := $(ROOT)/bin
TOOLS   := $(ROOT)/hack/tools
GO      ?= go

CONTROLLER_GEN := $(BIN)/controller-gen
CONTROLLER_GEN_PKG := sigs.k8s.io/controller-tools/cmd/controller-gen
KUBE_APISERVER := $(BIN)/kube-apiserver
ETCD           := $(BIN)/etcd
KUBECTL        := $(BIN)/kubectl
CONTROL_PLANE  := $(KUBE_APISERVER) $(ETCD) $(KUBECTL)
# The test node: kubelet and its peers from the same k8s.io/kubernetes
# build as kube-apiserver, containerd, CoreDNS, the images it runs.
NODE_KUBE      := $(BIN)/kubelet $(BIN)/kube-scheduler $(BIN)/kube-controller-manager $(BIN)/kube-proxy
CONTAINERD     := $(BIN)/containerd $(BIN)/containerd-shim-runc-v2 $(BIN)/ctr
COREDNS        := $(BIN)/coredns
OCIIMAGE       := $(BIN)/ociimage
CRANE          := $(BIN)/crane
IMAGES         := $(BIN)/images
NODE           := $(NODE_KUBE) $(CONTAINERD) $(COREDNS) $(IMAGES)/nats.tar $(IMAGES)/pause.tar $(IMAGES)/student-bridge-previous.tar
HELM           := $(BIN)/helm
PROMTOOL       := $(BIN)/promtool
PROMETHEUS     := $(BIN)/prometheus
GOLANGCI_LINT  := $(BIN)/golangci-lint
APIDIFF        := $(BIN)/apidiff
CHART          := deploy/helm/student-bridge
comma          := ,

# A KUBEBUILDER_ASSETS set by the user wins over the binaries built here:
# then nothing is built for the tests.
ifeq ($(origin KUBEBUILDER_ASSETS),undefined)
KUBEBUILDER_ASSETS := $(BIN)
TEST_DEPS := $(CONTROL_PLANE)
endif
# The node tier needs root; without it its tests skip and nothing of it is
# built.
ifeq ($(shell id -u),0)
NODE_DEPS := $(NODE)
endif
export KUBEBUILDER_ASSETS

TEST_FLAGS ?= -race -count=1 -timeout 30m

# Every decoder of input from outside (what services, anyone with a NATS
# permission or an older release wrote) is fuzzed for FUZZ_TIME beyond its
# corpus by make test: package:target. A failure's input lands in the
# package's testdata/fuzz; commit it with the fix. FUZZ_TIME is a count of
# inputs (go test's "Nx"), not a duration: a duration's deadline races the
# fuzzing workers in Go 1.26 and fails a target with "context deadline
# exceeded" on a busy machine, no input at fault (golang/go#75804).
FUZZ_TIME ?= 5000x
FUZZ_TARGETS := ./api/v1:FuzzParseReceipt ./api/v1:FuzzParseSnapshotRequest ./api/contract:FuzzParseRecord \
	./internal/natssink:FuzzEventRoundTrip ./consumer:FuzzDecode ./internal/natssink:FuzzDecodeMsg ./internal/natssink:FuzzScanAck \
	./internal/config:FuzzLoad ./internal/watchjson:FuzzFindKind ./internal/watchjson:FuzzDecodeEvent

# Every program this Makefile builds (the generators, `make build`'s
# bridge, the benchmark, the programs the tests build, see stack.Build, and
# every tool) is built as the image's binary is: static and -trimpath, and
# lint loads its type information the same way. A package then compiles
# once for all of them, the standard library included, and once more with
# -race for the tests. Between this module and hack/tools that holds only
# for a module both resolve to one version: check-modules keeps them so.
HOST_GO      := CGO_ENABLED=0 $(GO)
HOST_FLAGS   := -trimpath

# The tools are built without symbol tables or DWARF: nobody debugs them,
# and linking a dozen large binaries is a good part of their cold build.
TOOL_LDFLAGS := -ldflags='-s -w'
# The Kubernetes binaries also say which release they are, as a release
# build's do (kube-apiserver's /version, kubectl version, the tests).
kube_version = $(shell sed -n 's/.*k8s.io\/kubernetes v\(1\.[0-9.]*\).*/\1/p' $(1))
kube_ldflags = -ldflags='-s -w $(foreach p,k8s.io/component-base/version k8s.io/client-go/pkg/version,-X $(p).gitVersion=v$(1) -X $(p).gitMajor=1 -X $(p).gitMinor=$(word 2,$(subst ., ,$(1))))'

# The release this source is (internal/version) and the commit it is built
# from; both end up in the binary, the image's labels and its tag.
VERSION := $(shell sed -n 's/^var Version = "\(.*\)"/\1/p' internal/version/version.go)
COMMIT  ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
IMG     ?= student-bridge:$(VERSION)
# The image's binary: static, without the local stack (-tags nodev). The
# Dockerfile builds it with this same target, so the tests build what ships.
IMAGE_BINARY := $(BIN)/image/student-bridge
CA_ROOTS     ?= /etc/ssl/certs/ca-certificates.crt

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  %-14s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development

.PHONY: run
run: build $(TEST_DEPS) ## Run the bridge on a local stack (kube-apiserver + etcd + embedded NATS).
	$(BIN)/student-bridge dev --assets $(KUBEBUILDER_ASSETS)

.PHONY: control-plane
control-plane: $(CONTROL_PLANE) ## Build kube-apiserver, etcd and kubectl into bin/, what `student-bridge dev` runs (make run does it too).

# The tests that start no server (no kube-apiserver, no NATS) and need
# nothing built: the "nothing" tier of docs/development.md but the AsyncAPI
# parser (internal/contractgen, which installs from npm), and the
# benchmark's rendering.
UNIT_PKGS := ./api/contract ./cmd/student-bridge ./internal/config ./internal/stages ./internal/queue ./internal/records ./internal/soak

.PHONY: test-unit
test-unit: ## Run the tests that start no server, in seconds: nothing is built for them.
	$(GO) test -count=1 $(UNIT_PKGS)
	$(GO) test -count=1 -run '^(TestRenderBlocks|TestCommandQuotesForAShell|TestSelected)$$' ./test/bench

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate deepcopy code, the contract's JSON Schemas and AsyncAPI document, configs/student-bridge.yaml, the chart's values.schema.json, the Grafana dashboard, and the benchmark's figures, the support table and the timings in the docs (from docs/results).
	$(CONTROLLER_GEN) object paths=./api/...
	$(HOST_GO) run $(HOST_FLAGS) ./hack/configdoc configs/student-bridge.yaml deploy/manager/student-bridge.yaml
	$(HOST_GO) run $(HOST_FLAGS) ./hack/contractdoc
	$(HOST_GO) run $(HOST_FLAGS) ./hack/chartschema $(CHART)/values.schema.json
	$(HOST_GO) run $(HOST_FLAGS) ./hack/dashboard deploy/monitoring/dashboard.json
	cp deploy/monitoring/dashboard.json deploy/monitoring/alerts.yaml $(CHART)/files/
	$(HOST_GO) run $(HOST_FLAGS) ./test/bench -docs
	$(HOST_GO) run $(HOST_FLAGS) ./hack/compat -docs
	$(HOST_GO) run $(HOST_FLAGS) ./hack/timings -docs

.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate the CRD and RBAC under deploy/ (and their copies in the Helm chart).
	$(CONTROLLER_GEN) crd rbac:roleName=student-bridge paths=./... \
		output:crd:artifacts:config=deploy/crd output:rbac:artifacts:config=deploy/rbac
	cp deploy/crd/example.k8s.io_students.yaml $(CHART)/crds/
	cp deploy/rbac/role.yaml $(CHART)/files/role.yaml

.PHONY: verify-gen
verify-gen: $(CONTROLLER_GEN) ## Fail if generated code or manifests are stale (regenerates them in place).
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	mkdir -p "$$tmp/deploy" && cp -r api configs docs README.md "$$tmp/" && cp -r deploy/crd deploy/rbac deploy/manager deploy/helm deploy/monitoring "$$tmp/deploy/"; \
	$(MAKE) --no-print-directory -s generate manifests; \
	if ! diff -r "$$tmp/api" api || ! diff -r "$$tmp/configs" configs || ! diff -r "$$tmp/docs" docs || ! diff "$$tmp/README.md" README.md || ! diff -r "$$tmp/deploy/crd" deploy/crd || \
		! diff -r "$$tmp/deploy/rbac" deploy/rbac || ! diff -r "$$tmp/deploy/manager" deploy/manager || \
		! diff -r "$$tmp/deploy/helm" deploy/helm || ! diff -r "$$tmp/deploy/monitoring" deploy/monitoring; then \
		echo "generated files were stale and have been regenerated: review and commit them"; exit 1; fi

.PHONY: fmt
fmt: ## Run gofmt.
	gofmt -l -w $$(git ls-files '*.go')

# What may be at the repository root (DESIGN.md, "Layout").
ROOT_LAYOUT := .ci .dockerignore .gitignore CHANGELOG.md Dockerfile Makefile README.md api cmd configs consumer deploy docs examples go.mod go.sum hack internal reconciler sink test

.PHONY: vet
vet: check-tree ## Run go vet and check-tree.
	$(GO) vet ./...

.PHONY: lint
lint: $(GOLANGCI_LINT) check-tree check-modules ## Run golangci-lint with hack/golangci.yml (go vet among its linters), check-tree and check-modules.
	CGO_ENABLED=0 GOFLAGS="$(GOFLAGS) $(HOST_FLAGS)" $(GOLANGCI_LINT) run --config hack/golangci.yml ./...

# The modules this module and hack/tools both compile, each at one version
# in both, so that make test compiles it once (HOST_GO). A go get in either
# that moves one apart fails here and names it: align the lower one.
.PHONY: check-modules
check-modules: ## Fail if a module built by both this module and hack/tools resolves to two versions.
	@export LC_ALL=C; mods='{{with .Module}}{{.Path}} {{.Version}}{{end}}'; \
	here=$$($(GO) list -deps -f "$$mods" ./... | sort -u); \
	tools=$$(cd $(TOOLS) && $(GO) list -deps -tags $(HACK_TOOL_TAGS) -f "$$mods" $(call hack_tool_pkgs,$(HACK_TOOLS)) $(CONTROLLER_GEN_PKG) | sort -u); \
	apart=$$(join <(echo "$$here") <(echo "$$tools") | awk '$$2 != $$3 {print "  " $$1 " " $$2 " here, " $$3 " in hack/tools"}'); \
	if [ -n "$$apart" ]; then echo "modules at two versions, so compiled twice: align them (go get in the module with the lower one)"; echo "$$apart"; exit 1; fi

.PHONY: check-tree
check-tree: ## Fail on unformatted Go files, tracked files over 1 MiB (a binary committed by mistake) and files at the root the layout does not name.
	@stray=$$(git ls-files | cut -d/ -f1 | sort -u | grep -vxF $(addprefix -e ,$(ROOT_LAYOUT)) || true); if [ -n "$$stray" ]; then echo "not part of the layout at the repository root: $$stray"; exit 1; fi
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$unformatted" ]; then echo "not gofmt-ed: $$unformatted"; exit 1; fi
	@large=$$(git ls-files -z | xargs -0 -r stat -c '%s %n' 2>/dev/null | awk '$$1 > 1048576 {print $$2}' || true); if [ -n "$$large" ]; then echo "tracked files over 1 MiB: $$large"; exit 1; fi

.PHONY: build
build: ## Build bin/student-bridge.
	$(HOST_GO) build $(HOST_FLAGS) -o $(BIN)/student-bridge ./cmd/student-bridge

.PHONY: image-binary
image-binary: ## Build the image's binary, as the Dockerfile does: static, -tags nodev, the commit in it.
	CGO_ENABLED=0 GOOS=linux GOARCH=amd64 $(GO) build -tags nodev -trimpath \
		-ldflags="-s -w -X github.com/student-bridge/student-bridge/internal/version.Commit=$(COMMIT)" \
		-o $(IMAGE_BINARY) ./cmd/student-bridge

.PHONY: image
image: image-binary $(OCIIMAGE) ## Build the image $(IMG) as an archive, bin/images/student-bridge.tar, without a container engine.
	$(OCIIMAGE) -out $(IMAGES)/student-bridge.tar -tag $(IMG) -entrypoint /student-bridge -user 65532:65532 \
		-file $(IMAGE_BINARY):/student-bridge:0755 -file $(CA_ROOTS):/etc/ssl/certs/ca-certificates.crt:0644 \
		-label org.opencontainers.image.title=student-bridge -label org.opencontainers.image.version=$(VERSION) \
		-label org.opencontainers.image.revision=$(COMMIT)

# go test runs two test binaries at a time (-p is the CPU count), in the
# order the packages are named: the longest first (TEST_FIRST, minutes
# each, docs/development.md), so that the run does not end with one of
# them alone on the machine. The node tier (TEST_LAST) runs after them, by
# itself: a real node under a load of writes is what a busy machine fails
# first (its API server's writes time out), and beside test/e2e and lint
# it did.
TEST_FIRST := ./test/e2e ./test/bench ./internal/bridge
TEST_LAST  := ./test/node

# The tests leave about half of the two CPUs idle: they wait on servers,
# Leases and timers more than they compute. So lint (golangci-lint built,
# then run) and fuzz run beside them, at the lowest priority, on what the
# tests leave (test-beside). go test's own vet is off for the module:
# lint runs govet's analyzers over every package and its tests, and go
# test's vet would type-check each package and its dependencies once more.
.PHONY: test
test: verify-gen ## Check generated files, build the image and the tools, run every test with -race against a real kube-apiserver and NATS (lint and fuzz beside them), then the real node's (as root).
	$(MAKE) --no-print-directory -j2 -Otarget test-deps
	$(MAKE) --no-print-directory -j2 test-go test-beside
	$(GO) test $(TEST_FLAGS) -vet=off $(TEST_LAST)

.PHONY: test-go
test-go:
	$(GO) test $(TEST_FLAGS) -vet=off $(TEST_FIRST) $$($(GO) list ./... | grep -vxF $(addprefix -e $(shell $(GO) list -m)/,$(patsubst ./%,%,$(TEST_LAST))))
	cd hack/ociimage && $(GO) test $(TEST_FLAGS) ./...

.PHONY: test-beside
test-beside:
	nice -n 19 $(MAKE) --no-print-directory lint fuzz

# What the tests need, built two at a time after verify-gen has rewritten
# the generated files: a single go build leaves a core idle while it
# downloads modules or links.
.PHONY: test-deps
test-deps: image $(CRANE) $(TEST_DEPS) $(HELM) $(PROMTOOL) $(PROMETHEUS) $(APIDIFF) $(NODE_DEPS)

# The compatibility tier: the tests of what a Kubernetes version can break,
# run against the kube-apiserver of each supported version (hack/compat).
# Its results render the support table of docs/deploy.md. Each older
# kube-apiserver is a go build of its own (its k8s.io modules clash with the
# newest's); etcd and kubectl are the newest's.
COMPAT_VERSIONS   := 1.34 1.35 1.36
COMPAT_APISERVERS := $(foreach v,$(COMPAT_VERSIONS),$(BIN)/kube-$(v)/kube-apiserver)
COMPAT_ASSETS     := $(foreach v,$(COMPAT_VERSIONS),$(v)=bin/kube-$(v)) $(basename $(call kube_version,$(TOOLS)/go.mod))=bin

.PHONY: test-compat
test-compat: $(CONTROL_PLANE) $(HELM) $(COMPAT_APISERVERS) ## Run the compatibility tier on Kubernetes 1.34 to 1.37 and write docs/results/compat.json (its cost: docs/development.md).
	$(HOST_GO) run $(HOST_FLAGS) ./hack/compat -assets $(subst $(eval) ,$(comma),$(COMPAT_ASSETS)) -out docs/results/compat.json
	$(HOST_GO) run $(HOST_FLAGS) ./hack/compat -docs

# The soak: deploy/default on the test node for SOAK_DURATION under a
# steady load, with one of the node tier's faults every few minutes and a
# service writing receipts; a sample of every pod, the stream and the
# buckets every 30 s (test/node/soak_test.go). Its own target: an hour is
# no part of make test.
SOAK_DURATION ?= 60m
SOAK_OUT      ?= bench-results/soak.json
SOAK_FLAGS    ?=

.PHONY: soak
soak: ## Run the deployment on the test node for SOAK_DURATION (60m) under load, a fault every 5 minutes; results in SOAK_OUT (SOAK_FLAGS: -soak-rate, -soak-students, -soak-fault-every, -soak-faults, -soak-sample, -soak-settled, -soak-profiles DIR for heap profiles).
	$(MAKE) --no-print-directory -j2 -Otarget test-deps
	$(GO) test -count=1 -timeout 0 -vet=off -run '^TestSoak$$' -v $(TEST_LAST) -args -soak $(SOAK_DURATION) -soak-out $(abspath $(SOAK_OUT)) $(SOAK_FLAGS)

$(BIN)/kube-%/kube-apiserver: $(TOOLS)/kube-%/go.mod | $(ETCD) $(KUBECTL)
	cd $(TOOLS)/kube-$* && $(HOST_GO) build $(HOST_FLAGS) $(call kube_ldflags,$(call kube_version,$(TOOLS)/kube-$*/go.mod)) -o $(BIN)/kube-$*/ k8s.io/kubernetes/cmd/kube-apiserver
	ln -sf ../etcd ../kubectl $(BIN)/kube-$*/

# The fuzzer instruments every package its test binary links, so fuzz
# builds with -tags nostack: the test files that start servers (NATS, a
# kube-apiserver) say //go:build !nostack and are left out, and a target's
# binary links the decoders and their imports, not nats-server, envtest and
# client-go. fuzz fails if one of those is linked again. Its "ok" lines
# say "fuzzed": they are not the test run's (hack/timings reads those).
FUZZ_HEAVY := github.com/nats-io/nats-server/v2/server sigs.k8s.io/controller-runtime/pkg/envtest k8s.io/client-go/rest

.PHONY: fuzz
fuzz: ## Fuzz every decoder of outside input for FUZZ_TIME each, beyond its corpus (FUZZ_TARGETS).
	@set -e; for p in $(sort $(foreach t,$(FUZZ_TARGETS),$(firstword $(subst :, ,$(t))))); do \
		heavy=$$($(GO) list -deps -test -tags nostack $$p | grep -xF $(addprefix -e ,$(FUZZ_HEAVY)) | paste -sd' ' || true); \
		if [ -n "$$heavy" ]; then echo "fuzz: $$p's test binary links $$heavy; give the test file that imports it //go:build !nostack"; exit 1; fi; \
	done
	@set -e; for t in $(FUZZ_TARGETS); do \
		echo "fuzz $${t#*:} ($${t%%:*}) for $(FUZZ_TIME)"; \
		$(GO) test -tags nostack -run '^$$' -fuzz "^$${t#*:}$$" -fuzztime $(FUZZ_TIME) "$${t%%:*}" 2>&1 | \
			awk '{ sub(/^ok /, "fuzzed "); print; fflush() } /no fuzz tests to fuzz/ { none = 1 } END { exit none }' || \
			{ echo "fuzz: $$t failed, or names no fuzz target"; exit 1; }; \
	done

##@ Deployment (needs a container engine and a cluster; not used by the tests)

CONTAINER_TOOL ?= docker
OVERLAY ?= default

.PHONY: docker-build
docker-build: ## Build the container image $(IMG).
	$(CONTAINER_TOOL) build --build-arg COMMIT=$(COMMIT) -t $(IMG) .

# deploy and undeploy use the kubectl on PATH; only without one do they
# build bin/kubectl. deploy/admission (the finalizer policy) is applied
# where the API server serves MutatingAdmissionPolicy (Kubernetes 1.36 and
# later) unless FINALIZER_POLICY=false; elsewhere the bridge adds its
# finalizer itself.
DEPLOY_KUBECTL   := $(or $(shell command -v kubectl 2>/dev/null),$(KUBECTL))
FINALIZER_POLICY ?= true
POLICY_SERVED     = case "$$($(DEPLOY_KUBECTL) get --raw /apis/admissionregistration.k8s.io/v1 2>/dev/null)" in *'"kind":"MutatingAdmissionPolicy"'*) true;; *) false;; esac

.PHONY: deploy
deploy: $(filter $(KUBECTL),$(DEPLOY_KUBECTL)) ## Apply deploy/$(OVERLAY) (default, bridge-only or dev) with image $(IMG) to the current kubectl context, and deploy/admission where the cluster serves it.
	$(DEPLOY_KUBECTL) kustomize deploy/$(OVERLAY) | sed 's|image: student-bridge:dev|image: $(IMG)|' | $(DEPLOY_KUBECTL) apply --server-side -f -
	@if [ "$(FINALIZER_POLICY)" = false ]; then echo "FINALIZER_POLICY=false: deploy/admission not applied"; \
	elif $(POLICY_SERVED); then $(DEPLOY_KUBECTL) apply --server-side -k deploy/admission; \
	else echo "the API server serves no admissionregistration.k8s.io/v1 MutatingAdmissionPolicy (Kubernetes 1.35 or older): deploy/admission not applied, the bridge adds its finalizer itself"; fi

.PHONY: undeploy
undeploy: $(filter $(KUBECTL),$(DEPLOY_KUBECTL)) ## Delete what deploy applied (Students and their stream data included).
	@if $(POLICY_SERVED); then $(DEPLOY_KUBECTL) delete --ignore-not-found -k deploy/admission; fi
	$(DEPLOY_KUBECTL) kustomize deploy/$(OVERLAY) | $(DEPLOY_KUBECTL) delete --ignore-not-found -f -

BENCH_FLAGS ?=

.PHONY: bench
bench: $(TEST_DEPS) ## Run the end-to-end benchmark (hours with the defaults: narrow it with BENCH_FLAGS, e.g. -rates 100 -reps 3); results in bench-results/results.md, the load phase as data in results.json.
	$(HOST_GO) run $(HOST_FLAGS) ./test/bench $(BENCH_FLAGS)

##@ Tools (built from the Go module proxy into bin/, once)

.PHONY: tools
tools: $(CONTROLLER_GEN) $(CONTROL_PLANE) $(CRANE) $(HELM) $(PROMTOOL) $(PROMETHEUS) $(APIDIFF) $(GOLANGCI_LINT) $(NODE) ## Build controller-gen, kube-apiserver, etcd, kubectl, helm, promtool, prometheus, apidiff, golangci-lint and the test node's parts.

$(CONTROLLER_GEN): $(TOOLS)/go.mod
	cd $(TOOLS) && GOBIN=$(BIN) $(HOST_GO) install $(HOST_FLAGS) $(TOOL_LDFLAGS) $(CONTROLLER_GEN_PKG)

# hack/tools is one module for every tool that uses Kubernetes' client
# libraries: kube-apiserver, etcd and kubectl, the test node's kubelet,
# scheduler, controller-manager and kube-proxy, CoreDNS, helm, promtool and
# prometheus (and controller-gen), and apidiff, the public Go API's gate,
# which shares their golang.org/x/tools. In one module k8s.io/api, client-go and
# the rest resolve to one version and compile once for all of them; and
# when this make builds several of them (make test, tools, node), one go
# build makes them together. `make run` builds the three it runs, the
# first time in several minutes. remove_all_sd leaves out every cloud's
# service discovery (and its SDK) from prometheus, whose tests scrape
# static targets; no other tool has files under that tag.
HACK_TOOLS    := $(CONTROL_PLANE) $(NODE_KUBE) $(COREDNS) $(HELM) $(PROMTOOL) $(PROMETHEUS) $(APIDIFF)
HACK_TOOL_PKG := kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver kubectl=k8s.io/kubernetes/cmd/kubectl etcd=./cmd/etcd \
	kubelet=k8s.io/kubernetes/cmd/kubelet kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler \
	kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager kube-proxy=k8s.io/kubernetes/cmd/kube-proxy \
	coredns=./cmd/coredns helm=helm.sh/helm/v4/cmd/helm \
	promtool=github.com/prometheus/prometheus/cmd/promtool prometheus=github.com/prometheus/prometheus/cmd/prometheus \
	apidiff=golang.org/x/exp/cmd/apidiff
HACK_TOOL_TAGS := remove_all_sd
hack_tool_pkgs = $(foreach t,$(notdir $(1)),$(patsubst $(t)=%,%,$(filter $(t)=%,$(HACK_TOOL_PKG))))
HACK_TOOL_SRC := $(TOOLS)/go.mod $(wildcard $(TOOLS)/cmd/*/main.go)
build_hack_tools = cd $(TOOLS) && $(HOST_GO) build $(HOST_FLAGS) -tags $(HACK_TOOL_TAGS) $(call kube_ldflags,$(call kube_version,$(TOOLS)/go.mod)) -o $(BIN)/ $(call hack_tool_pkgs,$(1)) && touch $(1)

ifneq ($(filter test test-deps,$(MAKECMDGOALS)),)
BUILT_TOGETHER := $(CONTROL_PLANE) $(HELM) $(PROMTOOL) $(PROMETHEUS) $(APIDIFF) $(if $(NODE_DEPS),$(NODE_KUBE) $(COREDNS))
else ifneq ($(filter tools node,$(MAKECMDGOALS)),)
BUILT_TOGETHER := $(HACK_TOOLS)
else
BUILT_TOGETHER := $(CONTROL_PLANE)
endif
$(BUILT_TOGETHER) &: $(HACK_TOOL_SRC)
	$(call build_hack_tools,$(BUILT_TOGETHER))
$(filter-out $(BUILT_TOGETHER),$(HACK_TOOLS)): $(HACK_TOOL_SRC)
	$(call build_hack_tools,$@)

# containerd has a module of its own (its k8s.io versions differ from
# kube-apiserver's), built static. runc and the CNI plugins come from Debian
# (.ci/run installs them).
$(CONTAINERD) &: $(TOOLS)/containerd/go.mod
	cd $(TOOLS)/containerd && $(HOST_GO) build $(HOST_FLAGS) $(TOOL_LDFLAGS) -tags no_btrfs,no_devmapper,no_zfs -o $(BIN)/ \
		github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 github.com/containerd/containerd/v2/cmd/ctr
	touch $(CONTAINERD)

$(OCIIMAGE): hack/ociimage/go.mod hack/ociimage/main.go
	cd hack/ociimage && $(HOST_GO) build $(HOST_FLAGS) -o $(OCIIMAGE) .

# crane, to push make image's archive to a registry (docs/deploy.md), from
# the go-containerregistry that writes the archive.
$(CRANE): hack/ociimage/go.mod
	cd hack/ociimage && $(HOST_GO) build $(HOST_FLAGS) $(TOOL_LDFLAGS) -o $(CRANE) github.com/google/go-containerregistry/cmd/crane

# The images the manifests name, for the test node: nats-server from the
# version the tests embed, under the name deploy/nats gives it, and the pod
# sandbox's pause program.
$(IMAGES)/nats.tar: go.mod $(OCIIMAGE)
	$(HOST_GO) build $(HOST_FLAGS) $(TOOL_LDFLAGS) -o $(BIN)/image/nats-server github.com/nats-io/nats-server/v2
	$(OCIIMAGE) -out $@ -tag $$(sed -n 's/^ *image: \(nats:.*\)/\1/p' deploy/nats/statefulset.yaml) -entrypoint /nats-server -user 1000:1000 \
		-file $(BIN)/image/nats-server:/nats-server:0755

$(IMAGES)/pause.tar: hack/ociimage/pause/main.go $(OCIIMAGE)
	cd hack/ociimage && $(HOST_GO) build $(HOST_FLAGS) -o $(BIN)/image/pause ./pause
	$(OCIIMAGE) -out $@ -tag student-bridge.test/pause:1 -entrypoint /pause -user 65535:65535 -file $(BIN)/image/pause:/pause:0755

# The previous release, for the upgrade test: its tree (and chart) in
# bin/previous/src, its image tagged student-bridge:previous.
$(IMAGES)/student-bridge-previous.tar: hack/previous-release.sh $(OCIIMAGE)
	hack/previous-release.sh

.PHONY: node
node: $(NODE) $(CONTROL_PLANE) ## Build the test node's parts: kubelet, scheduler, controller-manager, kube-proxy, containerd, CoreDNS and its images.

# golangci-lint has a module of its own too.
$(GOLANGCI_LINT): $(TOOLS)/golangci-lint/go.mod
	cd $(TOOLS)/golangci-lint && GOBIN=$(BIN) $(HOST_GO) install $(HOST_FLAGS) $(TOOL_LDFLAGS) github.com/golangci/golangci-lint/v2/cmd/golangci-lint
	touch $(GOLANGCI_LINT)

.PHONY: monitoring-crds
monitoring-crds: $(CONTROLLER_GEN) ## Regenerate hack/crds: the Prometheus Operator's PrometheusRule and ServiceMonitor CRDs (from its Go types) that the chart tests install.
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	cd $(TOOLS) && $(CONTROLLER_GEN) crd:maxDescLen=0 paths=github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1 output:crd:dir="$$tmp" && \
	mkdir -p $(ROOT)/hack/crds && cp "$$tmp"/monitoring.coreos.com_prometheusrules.yaml "$$tmp"/monitoring.coreos.com_servicemonitors.yaml $(ROOT)/hack/crds/

.PHONY: helm-lint
helm-lint: $(HELM) ## Lint the Helm chart (the tests also lint it with other values).
	$(HELM) lint --strict $(CHART)

.PHONY: clean
clean: ## Remove bin/ and the local stack's state.
	rm -rf $(BIN) .dev
