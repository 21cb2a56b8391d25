# student-bridge: every developer and CI entry point. `make help` lists them.

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec
.DEFAULT_GOAL := help

ROOT    := $(abspath .)
BIN     := $(ROOT)/bin
TOOLS   := $(ROOT)/hack/tools
GO      ?= go

CONTROLLER_GEN := $(BIN)/controller-gen
KUBE_APISERVER := $(BIN)/kube-apiserver
ETCD           := $(BIN)/etcd
KUBECTL        := $(BIN)/kubectl
CONTROL_PLANE  := $(KUBE_APISERVER) $(ETCD) $(KUBECTL)
HELM           := $(BIN)/helm
PROMTOOL       := $(BIN)/promtool
PROMETHEUS     := $(BIN)/prometheus
CHART          := deploy/helm/student-bridge

# A KUBEBUILDER_ASSETS set by the user wins over the binaries built here:
# then nothing is built for the tests.
ifeq ($(origin KUBEBUILDER_ASSETS),undefined)
KUBEBUILDER_ASSETS := $(BIN)
TEST_DEPS := $(CONTROL_PLANE)
endif
export KUBEBUILDER_ASSETS

TEST_FLAGS ?= -race -count=1 -timeout 30m

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target>\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  %-14s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Development

.PHONY: run
run: build $(TEST_DEPS) ## Run the bridge on a local stack (kube-apiserver + etcd + embedded NATS).
	$(BIN)/student-bridge dev --assets $(KUBEBUILDER_ASSETS)

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate deepcopy code, configs/student-bridge.yaml, the chart's values.schema.json and the Grafana dashboard.
	$(CONTROLLER_GEN) object paths=./api/...
	$(GO) run ./hack/configdoc configs/student-bridge.yaml deploy/manager/student-bridge.yaml
	$(GO) run ./hack/chartschema $(CHART)/values.schema.json
	$(GO) run ./hack/dashboard deploy/monitoring/dashboard.json
	cp deploy/monitoring/dashboard.json deploy/monitoring/alerts.yaml $(CHART)/files/

.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate the CRD and RBAC under deploy/ (and their copies in the Helm chart).
	$(CONTROLLER_GEN) crd rbac:roleName=student-bridge paths=./... \
		output:crd:artifacts:config=deploy/crd output:rbac:artifacts:config=deploy/rbac
	cp deploy/crd/example.k8s.io_students.yaml $(CHART)/crds/
	cp deploy/rbac/role.yaml $(CHART)/files/role.yaml

.PHONY: verify-gen
verify-gen: $(CONTROLLER_GEN) ## Fail if generated code or manifests are stale (regenerates them in place).
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	mkdir -p "$$tmp/deploy" && cp -r api configs "$$tmp/" && cp -r deploy/crd deploy/rbac deploy/manager deploy/helm deploy/monitoring "$$tmp/deploy/"; \
	$(MAKE) --no-print-directory -s generate manifests; \
	if ! diff -r "$$tmp/api" api || ! diff -r "$$tmp/configs" configs || ! diff -r "$$tmp/deploy/crd" deploy/crd || \
		! diff -r "$$tmp/deploy/rbac" deploy/rbac || ! diff -r "$$tmp/deploy/manager" deploy/manager || \
		! diff -r "$$tmp/deploy/helm" deploy/helm || ! diff -r "$$tmp/deploy/monitoring" deploy/monitoring; then \
		echo "generated files were stale and have been regenerated: review and commit them"; exit 1; fi

.PHONY: fmt
fmt: ## Run gofmt.
	gofmt -l -w $$(git ls-files '*.go')

# What may be at the repository root (DESIGN.md, "Layout").
ROOT_LAYOUT := .ci .dockerignore .gitignore Dockerfile Makefile README.md api cmd configs consumer deploy docs examples go.mod go.sum hack internal reconciler sink test

.PHONY: vet
vet: ## Run go vet; fail on unformatted Go files, tracked files over 1 MiB (a binary committed by mistake) and files at the root the layout does not name.
	$(GO) vet ./...
	@stray=$$(git ls-files | cut -d/ -f1 | sort -u | grep -vxF $(addprefix -e ,$(ROOT_LAYOUT)) || true); if [ -n "$$stray" ]; then echo "not part of the layout at the repository root: $$stray"; exit 1; fi
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$unformatted" ]; then echo "not gofmt-ed: $$unformatted"; exit 1; fi
	@large=$$(git ls-files -z | xargs -0 -r stat -c '%s %n' 2>/dev/null | awk '$$1 > 1048576 {print $$2}' || true); if [ -n "$$large" ]; then echo "tracked files over 1 MiB: $$large"; exit 1; fi

.PHONY: build
build: ## Build bin/student-bridge.
	$(GO) build -o $(BIN)/student-bridge ./cmd/student-bridge

.PHONY: test
test: verify-gen vet $(TEST_DEPS) $(HELM) $(PROMTOOL) $(PROMETHEUS) ## Check generated files, vet, and run every test with -race against a real kube-apiserver and NATS.
	$(GO) test $(TEST_FLAGS) ./...

##@ Deployment (needs a container engine and a cluster; not used by the tests)

IMG ?= student-bridge:dev
CONTAINER_TOOL ?= docker
OVERLAY ?= default

.PHONY: docker-build
docker-build: ## Build the container image $(IMG).
	$(CONTAINER_TOOL) build -t $(IMG) .

.PHONY: deploy
deploy: $(KUBECTL) ## Apply deploy/$(OVERLAY) (default, bridge-only or dev) with image $(IMG) to the current kubectl context.
	$(KUBECTL) kustomize deploy/$(OVERLAY) | sed 's|image: student-bridge:dev|image: $(IMG)|' | $(KUBECTL) apply --server-side -f -

.PHONY: undeploy
undeploy: $(KUBECTL) ## Delete what deploy applied (Students and their stream data included).
	$(KUBECTL) kustomize deploy/$(OVERLAY) | $(KUBECTL) delete --ignore-not-found -f -

BENCH_FLAGS ?=

.PHONY: bench
bench: $(TEST_DEPS) ## Run the end-to-end benchmark (hours with the defaults: narrow it with BENCH_FLAGS, e.g. -rates 100 -reps 3); results in bench-results/results.md.
	$(GO) run ./test/bench $(BENCH_FLAGS)

##@ Tools (built from the Go module proxy into bin/, once)

.PHONY: tools
tools: $(CONTROLLER_GEN) $(CONTROL_PLANE) $(HELM) $(PROMTOOL) $(PROMETHEUS) ## Build controller-gen, kube-apiserver, etcd, kubectl, helm, promtool and prometheus.

$(CONTROLLER_GEN): $(TOOLS)/go.mod
	cd $(TOOLS) && GOBIN=$(BIN) $(GO) install sigs.k8s.io/controller-tools/cmd/controller-gen

# kube-apiserver, etcd and kubectl come from k8s.io/kubernetes and etcd's
# server module; this takes several minutes the first time.
$(KUBE_APISERVER) $(KUBECTL) $(ETCD) &: $(TOOLS)/go.mod
	cd $(TOOLS) && $(GO) build -o $(BIN)/ k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kubectl ./cmd/etcd
	touch $(KUBE_APISERVER) $(KUBECTL) $(ETCD)

# helm has a module of its own (its k8s.io versions differ from
# kube-apiserver's); only the chart tests need it, so `make run` never waits
# for it.
$(HELM): $(TOOLS)/helm/go.mod
	cd $(TOOLS)/helm && GOBIN=$(BIN) $(GO) install helm.sh/helm/v4/cmd/helm
	touch $(HELM)

# promtool and the Prometheus server, for the alerts' tests, have a module
# of their own too.
$(PROMTOOL) $(PROMETHEUS) &: $(TOOLS)/prometheus/go.mod
	cd $(TOOLS)/prometheus && GOBIN=$(BIN) $(GO) install github.com/prometheus/prometheus/cmd/promtool github.com/prometheus/prometheus/cmd/prometheus
	touch $(PROMTOOL) $(PROMETHEUS)

.PHONY: monitoring-crds
monitoring-crds: $(CONTROLLER_GEN) ## Regenerate hack/crds: the Prometheus Operator's PrometheusRule and ServiceMonitor CRDs (from its Go types) that the chart tests install.
	@tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	cd $(TOOLS)/prometheus && $(CONTROLLER_GEN) crd:maxDescLen=0 paths=github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1 output:crd:dir="$$tmp" && \
	mkdir -p $(ROOT)/hack/crds && cp "$$tmp"/monitoring.coreos.com_prometheusrules.yaml "$$tmp"/monitoring.coreos.com_servicemonitors.yaml $(ROOT)/hack/crds/

.PHONY: helm-lint
helm-lint: $(HELM) ## Lint the Helm chart (the tests also lint it with other values).
	$(HELM) lint --strict $(CHART)

.PHONY: clean
clean: ## Remove bin/ and the local stack's state.
	rm -rf $(BIN) .dev
