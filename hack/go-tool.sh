#!/usr/bin/env bash
# Builds a Go command from the module proxy into a path, unless the binary
# there is already that version: hack/go-tool.sh BINARY PACKAGE VERSION.
# The version comes from the binary's build information, so a stale
# binary is replaced, never trusted.
set -euo pipefail
bin=$1 pkg=$2 version=$3
GO=${GO:-go}
if [[ -x $bin ]] && $GO version -m "$bin" | awk '$1 == "mod" {print $3}' | grep -qx -- "$version"; then
	exit 0
fi
echo "building $pkg@$version into $(dirname "$bin") (once)"
mkdir -p "$(dirname "$bin")"
GOBIN=$(cd "$(dirname "$bin")" && pwd) $GO install "$pkg@$version"
