#!/usr/bin/env bash
# make deps-check: the node daemons must not link packages that cost their
# memory. text/template (and html/template, which golang.org/x/net/trace
# brings in through grpc unless built with grpcnotrace) calls methods by
# name through reflect, so the linker keeps every exported method of every
# type that reaches an interface: a third of the plugin's binary, and of its
# resident memory. An informer factory links an informer and a lister for
# every API group.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
TAGS=${TAGS:-grpcnotrace}
banned='^(text/template|html/template|golang.org/x/net/trace|k8s.io/client-go/informers)$'
status=0
for cmd in kyb-dra-plugin kyb-device-plugin; do
	deps=$($GO list -tags "$TAGS" -deps "./cmd/$cmd")
	found=$(grep -E "$banned" <<<"$deps" || true)
	for pkg in $found; do
		importers=$($GO list -tags "$TAGS" -deps -f '{{.ImportPath}}: {{join .Imports " "}}' "./cmd/$cmd" |
			awk -v p="$pkg" '{for (i = 2; i <= NF; i++) if ($i == p) {sub(/:$/, "", $1); print $1}}' | tr '\n' ' ')
		echo "deps-check: cmd/$cmd links $pkg (imported by: $importers); see hack/deps-check.sh for why it must not" >&2
		status=1
	done
done
[[ $status == 0 ]] && echo "deps-check: the node daemons link none of the banned packages (tags: $TAGS)"
exit $status
