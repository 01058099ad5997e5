#!/usr/bin/env bash
# Prepares the patched allocator for the benchmarks: a copy of
# k8s.io/dynamic-resource-allocation at the version the test module uses,
# taken from the module cache, with test/allocpatch/*.patch applied in
# name order, and a go.mod for the test module that replaces the stock
# module with the copy (used through go's -modfile, so nothing committed
# changes). Only the patches are ours; the copy is made here, under
# _output, and never committed.
#
#   hack/allocator-patch.sh    prints the -modfile to build with
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
root=$PWD
out=$root/_output/allocator-patched
mod=k8s.io/dynamic-resource-allocation
version=$(cd test && $GO list -m -f '{{if .Replace}}{{.Replace.Version}}{{else}}{{.Version}}{{end}}' $mod)
src=$(cd test && $GO mod download -json $mod@$version | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
if [ -z "$src" ] || [ ! -d "$src" ]; then
  echo "allocator-patch: $mod@$version is not in the module cache" >&2
  exit 1
fi
copy=$out/dynamic-resource-allocation
stamp="$version $(cat test/allocpatch/*.patch test/go.mod test/go.sum | sha256sum | cut -c1-16)"
if [ "$(cat "$out/stamp" 2>/dev/null)" != "$stamp" ]; then
  rm -rf "$out"
  mkdir -p "$out"
  cp -r "$src" "$copy"
  chmod -R u+w "$copy"
  for p in test/allocpatch/*.patch; do
    # git apply outside any repository (the copy lies inside ours).
    if ! (cd "$copy" && GIT_CEILING_DIRECTORIES="$out" git apply -p1 "$root/$p"); then
      echo "allocator-patch: $p does not apply to $mod@$version" >&2
      exit 1
    fi
  done
  cp test/go.mod "$out/test.mod"
  cp test/go.sum "$out/test.sum"
  $GO mod edit -modfile="$out/test.mod" -replace "$mod=$copy"
  echo "$stamp" >"$out/stamp"
fi
echo "$out/test.mod"
