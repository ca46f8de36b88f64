#!/usr/bin/env bash
# Fails when the checked-in generated files (deepcopy code, CRD manifests,
# the reference pages of docs/reference) differ from what hack/generate.sh
# produces from the current API types and flag definitions.
# It regenerates into a temporary copy, so the work tree is left untouched.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TMP="$(mktemp -d)"
trap 'rm -rf "${TMP}"' EXIT

# Just what generation reads and writes: the module files, the API types,
# the scripts and the current CRDs (so removed kinds show up as a diff).
mkdir -p "${TMP}/charts/vipcast"
cp -a "${ROOT}/go.mod" "${ROOT}/go.sum" "${ROOT}/api" "${ROOT}/hack" "${TMP}/"
if [[ -d "${ROOT}/charts/vipcast/crds" ]]; then
	cp -a "${ROOT}/charts/vipcast/crds" "${TMP}/charts/vipcast/"
fi

"${TMP}/hack/generate.sh"

stale=0
for path in api charts/vipcast/crds; do
	if ! diff -ruN "${ROOT}/${path}" "${TMP}/${path}"; then
		stale=1
	fi
done
# The reference pages: their tests compare them with the code.
if ! (cd "${ROOT}" && go test ./cmd/vipcast-speaker -run '^TestFlagsReference$' -count=1 >/dev/null); then
	echo >&2 "docs/reference/speaker-flags.md differs from vipcast-speaker's flags (go test ./cmd/vipcast-speaker -run TestFlagsReference shows how)"
	stale=1
fi
if ! (cd "${ROOT}" && go test ./api/v1alpha1 -run '^TestCRDReference$' -count=1 >/dev/null); then
	echo >&2 "docs/reference/crds.md differs from the CRDs (go test ./api/v1alpha1 -run TestCRDReference shows how)"
	stale=1
fi
if ! (cd "${ROOT}" && go test ./cmd/vipcast-ccm -run '^TestFlagsReference$' -count=1 >/dev/null); then
	echo >&2 "docs/reference/ccm-flags.md differs from vipcast-ccm's flags (go test ./cmd/vipcast-ccm -run TestFlagsReference shows how)"
	stale=1
fi
if ! (cd "${ROOT}" && go test ./test/chart -run '^(TestMetricsReference|TestValuesReference)$' -count=1 >/dev/null); then
	echo >&2 "docs/reference/metrics.md or helm-values.md differs from the metrics' definitions or values.yaml (go test ./test/chart -run 'TestMetricsReference|TestValuesReference' shows how)"
	stale=1
fi
if [[ "${stale}" -ne 0 ]]; then
	echo >&2 "generated files are stale: run make generate"
	exit 1
fi
echo "generated files are up to date"
