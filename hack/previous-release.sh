#!/usr/bin/env bash
# Builds the previous release for the node tier's upgrade test
# (test/node): its source tree (with its chart) into bin/previous/src and
# its image into bin/images/student-bridge-previous.tar, tagged
# student-bridge:previous. The commit comes from git history, so a clone
# needs it (a full clone has it; tags need not travel).
#
# Until v0.1.0 has a successor, the previous release is c5d2786, the commit
# v0.1.0's work started from. Its image build (-tags nodev) did not compile:
# a stub kept an old signature. It is built as its Dockerfile meant, with
# that one line mended, because without the tag its binary links the test
# packages and dies at start under the chart's readOnlyRootFilesystem.
set -euo pipefail
PREVIOUS=c5d27864acc967a3016c60685d87d300c9a0849a
root=$(cd "$(dirname "$0")/.." && pwd)
bin=$root/bin
src=$bin/previous/src
rm -rf "$bin/previous"
mkdir -p "$src"
git -C "$root" archive "$PREVIOUS" | tar -x -C "$src"
if [ "$PREVIOUS" = c5d27864acc967a3016c60685d87d300c9a0849a ]; then
	sed -i 's/^func newDevCommand(func(), \*string)/func newDevCommand(logSetup, *string)/' "$src/cmd/student-bridge/dev_disabled.go"
fi
(cd "$src" && CGO_ENABLED=0 GOOS=linux GOARCH=amd64 go build -tags nodev -trimpath -ldflags="-s -w" -o "$bin/previous/student-bridge" ./cmd/student-bridge)
"$bin/ociimage" -out "$bin/images/student-bridge-previous.tar" -tag student-bridge:previous -entrypoint /student-bridge -user 65532:65532 \
	-file "$bin/previous/student-bridge:/student-bridge:0755" -file "${CA_ROOTS:-/etc/ssl/certs/ca-certificates.crt}:/etc/ssl/certs/ca-certificates.crt:0644" \
	-label org.opencontainers.image.title=student-bridge -label org.opencontainers.image.revision="$PREVIOUS"
