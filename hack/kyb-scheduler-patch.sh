#!/usr/bin/env bash
# Prepares what kyb-scheduler builds against: copies of
# k8s.io/dynamic-resource-allocation and k8s.io/kubernetes, at the versions
# cmd/kyb-scheduler/go.mod requires, taken from the module cache, with our
# patches applied in name order:
#
#   test/allocpatch/*.patch                    the DRA allocator (docs/upstream-allocator-proposal.md)
#   cmd/kyb-scheduler/patches/kubernetes/*.patch   kube-scheduler (an in-flight share counted once)
#
# The copies go to _output/kyb-scheduler, where cmd/kyb-scheduler/go.mod
# replaces both modules: a go build in the module without them fails,
# naming the missing directory, rather than building a stock scheduler.
# Only the patches are ours; the copies are made here, never committed,
# and made again only when a patch, this script or a version changes.
# make build runs it, and so does the Dockerfile's build stage (it needs
# git, for git apply, and the module proxy).
#
#   hack/kyb-scheduler-patch.sh
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
root=$PWD
out=$root/_output/kyb-scheduler
gomod=cmd/kyb-scheduler/go.mod

# The version a module is required at (a require line: "path version").
required() {
	local v
	v=$(awk -v m="$1" '($1 == m && $2 ~ /^v/) || ($1 == "require" && $2 == m) {print ($1 == "require" ? $3 : $2); exit}' "$gomod")
	if [[ -z $v ]]; then
		echo "kyb-scheduler-patch: $gomod does not require $1" >&2
		exit 1
	fi
	echo "$v"
}

declare -A patches=(
	[dynamic-resource-allocation]=test/allocpatch
	[kubernetes]=cmd/kyb-scheduler/patches/kubernetes
)
stamp=$(
	for name in dynamic-resource-allocation kubernetes; do
		echo "$name $(required "k8s.io/$name") $(cat "${patches[$name]}"/*.patch | sha256sum | cut -c1-16)"
	done
	echo "script $(sha256sum <"$0" | cut -c1-16)"
)
if [[ "$(cat "$out/stamp" 2>/dev/null)" == "$stamp" ]]; then
	exit 0
fi
rm -rf "$out"
mkdir -p "$out"
# Outside any module: only the named versions are downloaded.
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for name in dynamic-resource-allocation kubernetes; do
	mod=k8s.io/$name
	version=$(required "$mod")
	src=$(cd "$scratch" && GOFLAGS= GOWORK=off $GO mod download -json "$mod@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	if [[ -z $src || ! -d $src ]]; then
		echo "kyb-scheduler-patch: $mod@$version is not in the module cache and could not be downloaded" >&2
		exit 1
	fi
	copy=$out/$name
	cp -r "$src" "$copy"
	chmod -R u+w "$copy"
	for p in "${patches[$name]}"/*.patch; do
		# git apply outside any repository (the copy lies inside ours).
		if ! (cd "$copy" && GIT_CEILING_DIRECTORIES="$out" git apply -p1 "$root/$p"); then
			echo "kyb-scheduler-patch: $p does not apply to $mod@$version" >&2
			exit 1
		fi
	done
	echo "kyb-scheduler-patch: $mod@$version with $(ls "${patches[$name]}"/*.patch | wc -l) patch(es) in ${copy#"$root"/}" >&2
done
echo "$stamp" >"$out/stamp"
