#!/usr/bin/env bash
# hack/release.sh — `make release`: build vipcast for linux/amd64 and
# linux/arm64, push both images as multi-platform OCI indexes and the Helm
# chart as an OCI artifact to a registry, and write the checksums.
#
#   make release REGISTRY=registry.example:5000/vipcast VERSION=0.1.0
#
# REGISTRY      where the release is pushed: HOST[:PORT]/PATH (required)
# VERSION       the release's semantic version, with or without a leading v
#               (required); the chart's version and appVersion, the images' tag
# IMAGE_REGISTRY the registry the packaged chart names for its images, as the
#               nodes reach it (default REGISTRY): the same registry under
#               another name, such as a lab's pushed to on loopback
# PLAIN_HTTP    true: talk to the registry over HTTP (a lab's registry)
# RELEASE_DIR   where the binaries, the chart package and SHA256SUMS go
#               (default _output/release/VERSION)
# HELM          the helm binary (make passes the one it builds)
#
# A version without a pre-release part (1.2.3, not 1.2.3-rc.1) needs its
# entry in CHANGELOG.md first.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "release: $*" >&2; exit 1; }

[ -n "${REGISTRY:-}" ] || fail "set REGISTRY=HOST[:PORT]/PATH, the registry to push to (e.g. REGISTRY=registry.example:5000/vipcast)"
[ -n "${VERSION:-}" ] || fail "set VERSION to the release's semantic version (e.g. VERSION=0.1.0)"
version=${VERSION#v}
semver='^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$'
[[ $version =~ $semver ]] || fail "VERSION=$VERSION is not a semantic version MAJOR.MINOR.PATCH[-PRERELEASE] (the chart's version must be one)"
[[ $REGISTRY != *://* ]] || fail "REGISTRY=$REGISTRY: give HOST[:PORT]/PATH without a scheme (PLAIN_HTTP=true for HTTP)"
REGISTRY=${REGISTRY%/}
image_registry=${IMAGE_REGISTRY:-$REGISTRY}
image_registry=${image_registry%/}
helm=${HELM:-helm}
out=${RELEASE_DIR:-_output/release/$version}
http=() helm_http=()
if [ "${PLAIN_HTTP:-false}" = true ]; then http=(-plain-http) helm_http=(--plain-http); fi

if [[ $version != *-* ]] && ! grep -q "^## \[$version\]" CHANGELOG.md; then
	fail "CHANGELOG.md has no entry \"## [$version]\": write what changed, and the upgrade notes, first"
fi

rm -rf "$out"
mkdir -p "$out"
out=$(cd "$out" && pwd)
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}

echo ">> building vipcast $version for linux/amd64 and linux/arm64"
for arch in amd64 arm64; do
	mkdir -p "$out/linux_$arch"
	GOOS=linux GOARCH=$arch CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o "$out/linux_$arch/" \
		./cmd/vipcast-ccm ./cmd/vipcast-speaker ./cmd/kubectl-vipcast
done

for bin in vipcast-ccm vipcast-speaker; do
	echo ">> pushing $REGISTRY/$bin:$version (linux/amd64, linux/arm64) and checking what the registry serves"
	go -C hack/image run . index "${http[@]}" -repository "$REGISTRY/$bin" -tag "$version" \
		"linux/amd64=$out/linux_amd64/$bin" "linux/arm64=$out/linux_arm64/$bin" | tee -a "$out/images.txt"
done

echo ">> packaging the chart $version (images from $image_registry) and pushing it to oci://$REGISTRY/charts"
chart="$out/chart/vipcast"
mkdir -p "$out/chart"
cp -r charts/vipcast "$chart"
sed -i -E "s/^version: .*/version: $version/; s/^appVersion: .*/appVersion: \"$version\"/" "$chart/Chart.yaml"
sed -i -E "s#^(    repository: )vipcast/(vipcast-(ccm|speaker))\$#\1$image_registry/\2#" "$chart/values.yaml"
[ "$(grep -cE "^    repository: $image_registry/vipcast-(ccm|speaker)\$" "$chart/values.yaml")" = 2 ] ||
	fail "$chart/values.yaml: could not point both image repositories at $image_registry (did the values' layout change?)"
"$helm" package "$chart" -d "$out" >/dev/null
rm -rf "$out/chart"
"$helm" push "$out/vipcast-$version.tgz" "oci://$REGISTRY/charts" "${helm_http[@]}" 2>&1 | tee "$out/chart.txt"

(cd "$out" && sha256sum "vipcast-$version.tgz" linux_*/* >SHA256SUMS)
echo ">> release $version: oci://$REGISTRY/charts/vipcast --version $version; checksums in $out/SHA256SUMS"
