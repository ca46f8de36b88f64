#!/usr/bin/env bash
# Regenerates the code and manifests derived from the API types in api/:
#   api/v1alpha1/zz_generated.deepcopy.go    DeepCopy methods
#   charts/vipcast/crds/vipcast.io_*.yaml     CustomResourceDefinitions
#
# controller-gen runs through `go run pkg@version`, so its dependencies stay
# out of this module's go.mod. The first run downloads and builds it (a few
# minutes on 2 cores); later runs use the Go build cache.
set -euo pipefail

CONTROLLER_GEN_VERSION="${CONTROLLER_GEN_VERSION:-v0.23.0}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"

CRD_DIR=charts/vipcast/crds
mkdir -p "${CRD_DIR}"
# controller-gen never deletes manifests of removed kinds: start clean.
rm -f "${CRD_DIR}"/vipcast.io_*.yaml

go run "sigs.k8s.io/controller-tools/cmd/controller-gen@${CONTROLLER_GEN_VERSION}" \
	object:headerFile=hack/boilerplate.go.txt \
	crd:crdVersions=v1 \
	paths=./api/... \
	output:crd:artifacts:config="${CRD_DIR}"

# The reference pages generated from the code (docs/reference): each is
# written by its test with -update-reference, and the same test, run without
# it (make test, make verify), fails when the page is stale. The copy of
# the API types hack/verify-generate.sh regenerates has no pages to write:
# that script runs the tests on the tree itself.
if [[ -d docs/reference ]]; then
	go test ./api/v1alpha1 -run '^TestCRDReference$' -count=1 -args -update-reference >/dev/null
	go test ./cmd/vipcast-speaker -run '^TestFlagsReference$' -count=1 -args -update-reference >/dev/null
	go test ./cmd/vipcast-ccm -run '^TestFlagsReference$' -count=1 -args -update-reference >/dev/null
	go test ./test/chart -run '^(TestMetricsReference|TestValuesReference)$' -count=1 -args -update-reference >/dev/null
fi
