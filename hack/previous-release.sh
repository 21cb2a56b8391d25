#!/usr/bin/env bash
# Builds the previous release for the node tier's upgrade test
# (test/node): its source tree (with its chart) into bin/previous/src and
# its image into bin/images/student-bridge-previous.tar, tagged
# student-bridge:previous. The commit comes from git history, so a clone
# needs it (a full clone has it; tags need not travel).
#
# The previous release is v0.1.0: acff4a7, the commit that set its version.
set -euo pipefail
PREVIOUS=acff4a7af3cdd4205ba2dc7b62698a41ed1d6b79
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/bin
src=$bin/previous/src
rm -rf "$bin/previous"
mkdir -p "$src"
git -C "$root" archive "$PREVIOUS" | tar -x -C "$src"
# Its code as released, built with this tree's go.mod and go.sum: the
# modules they share are a patch or a minor version apart, and at this
# tree's versions the build reuses what the image's build compiled (at its
# own, it compiled every dependency again: minutes of a cold make test).
# What the upgrade test exercises is the release's code, chart and data.
# Should the release need a module this tree no longer has, it is built
# with its own go.mod instead.
build() { (cd "$src" && CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -tags nodev -trimpath -ldflags="-s -w" -o "$bin/previous/student-bridge" ./cmd/student-bridge); }
cp "$src/go.mod" "$src/go.sum" "$bin/previous/"
cp "$root/go.mod" "$root/go.sum" "$src/"
if ! build 2>"$bin/previous/build.log"; then
	echo "previous-release: not built with this tree's modules (bin/previous/build.log); building with its own"
	cp "$bin/previous/go.mod" "$bin/previous/go.sum" "$src/"
	build
fi
"$bin/ociimage" -out "$bin/images/student-bridge-previous.tar" -tag student-bridge:previous -entrypoint /student-bridge -user 65532:65532 \
	-file "$bin/previous/student-bridge:/student-bridge:0755" -file "${CA_ROOTS:-/etc/ssl/certs/ca-certificates.crt}:/etc/ssl/certs/ca-certificates.crt:0644" \
	-label org.opencontainers.image.title=student-bridge -label org.opencontainers.image.revision="$PREVIOUS"
