#!/usr/bin/env bash
# Checks the container image's recipe without a Docker engine (`make
# image-check`): the image cannot be built on a machine without one, so it
# is kept correct by checking each thing the build depends on.
#
#   1. The build context: every COPY source exists, and .dockerignore keeps
#      nothing out of it that the build needs. The context is rebuilt in a
#      temporary directory (COPY sources minus .dockerignore; `**/x`, `x` and
#      `x/*` patterns, which is what .dockerignore uses) and ...
#   2. ... the build stage's `go build` RUN line runs there as written, with
#      the Dockerfile's ARG defaults, into a temporary /out.
#   3. The binaries need nothing from the host but glibc: libnvidia-ml stays
#      unresolved (it is dlopened from the node's driver at run time).
#   4. Versions agree: the Dockerfile's Go with go.mod, its VERSION with the
#      chart's appVersion and the Makefile's VERSION, the Kubernetes version
#      kyb-scheduler reports with the one its go.mod builds; the chart's image
#      repository with the Makefile's IMAGE; the chart's commands with the
#      binaries and where the Dockerfile puts them.
#   5. The runtime stage has glibc (not distroless/static or scratch) and
#      sets a non-root USER.
#   6. The image without Docker (make image-oci, test/cmd/kyb-image), built
#      here from the same context, holds in /usr/local/bin exactly the
#      binaries of step 2, byte for byte (both builds run the RUN line with
#      -trimpath and the same flags), and the runtime stage's USER,
#      ENTRYPOINT and LABELs, read here independently of kyb-image; an
#      archive given as ARCHIVE (make's) is the same image, digest for
#      digest. Where a Docker engine answers and has IMAGE:VERSION (make
#      image), `docker save` of it is compared too: names, modes and
#      configuration must agree; its binaries' bytes may not (its golang
#      image's Go release and gcc may differ from this machine's), so
#      where they differ their build settings (go version -m) must agree.
#
# Usage: hack/image-check.sh [IMAGE] [VERSION] [ARCHIVE]   (make image-check passes all three)
set -euo pipefail
cd "$(dirname "$0")/.."

image="${1:-}"
version="${2:-}"
archive="${3:-}"
chart=deployments/helm/kyb-dra-driver
fail=0
problem() { echo "image-check: $*" >&2; fail=1; }

# ARG defaults of the Dockerfile (global and per stage; later wins).
declare -A arg
while IFS= read -r line; do
	if [[ $line =~ ^ARG[[:space:]]+([A-Za-z_]+)=\"?([^\"]*)\"?$ ]]; then
		arg[${BASH_REMATCH[1]}]=${BASH_REMATCH[2]}
	fi
done < Dockerfile

# 1. The build context.
ctx=$(mktemp -d)
out=$(mktemp -d)
trap 'rm -rf "$ctx" "$out"' EXIT
mapfile -t ignore < <(grep -v '^[[:space:]]*#' .dockerignore | sed '/^[[:space:]]*$/d')
# As Docker reads it: the last pattern that matches decides, and a
# pattern starting with ! lets back in what an earlier one kept out.
ignored() {
	local p=$1 pat out=1
	for pat in "${ignore[@]}"; do
		local keep=1
		if [[ $pat == '!'* ]]; then
			keep=0
			pat=${pat#!}
		fi
		local bare=${pat#\*\*/}
		# shellcheck disable=SC2053 # glob matching is the point
		if [[ $p == $pat || $p == $pat/* || $p == $bare || $p == $bare/* || $p == */$bare || $p == */$bare/* ]]; then
			out=$((1 - keep))
		fi
	done
	return $out
}
sources=()
while IFS= read -r line; do
	[[ $line =~ ^COPY[[:space:]] ]] || continue
	[[ $line =~ --from= ]] && continue
	read -ra words <<<"$line"
	# COPY src... dst
	for ((i = 1; i < ${#words[@]} - 1; i++)); do
		sources+=("${words[$i]%/}")
	done
done < Dockerfile
for src in "${sources[@]}"; do
	if [[ ! -e $src ]]; then
		problem "Dockerfile copies $src, which does not exist"
		continue
	fi
	if ignored "$src"; then
		problem "Dockerfile copies $src, which .dockerignore keeps out of the context"
		continue
	fi
	while IFS= read -r f; do
		ignored "$f" && continue
		mkdir -p "$ctx/$(dirname "$f")"
		cp "$f" "$ctx/$f"
	done < <(find "$src" -type f)
done
echo "image-check: build context: ${#sources[@]} COPY sources, $(find "$ctx" -type f | wc -l) files"

# 2. The build stage's go build, as written.
run=$(grep -E '^RUN .*go build' Dockerfile | head -1)
if [[ -z $run ]]; then
	problem "no 'RUN ... go build' line in the Dockerfile"
else
	cmd=${run#RUN }
	cmd=${cmd//\/out\//$out\/}
	for name in "${!arg[@]}"; do
		cmd=${cmd//\$\{$name\}/${arg[$name]}}
	done
	echo "image-check: (cd <context> && $cmd)"
	# As a RUN runs it: umask 022, no GOFLAGS (kyb-image does the same).
	if ! (cd "$ctx" && unset GOFLAGS && umask 022 && eval "$cmd"); then
		problem "the Dockerfile's go build fails on its own build context"
	fi
fi

# 3. What the binaries need at run time.
want_bins=()
for d in cmd/*/; do
	# kubectl plugins run on operators' machines, not from the image.
	[[ $(basename "$d") == kubectl-* ]] && continue
	want_bins+=("$(basename "$d")")
done
for b in "${want_bins[@]}"; do
	if [[ ! -x $out/$b ]]; then
		problem "the build made no $b"
		continue
	fi
	needed=$(readelf -d "$out/$b" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort | tr '\n' ' ')
	for lib in $needed; do
		case $lib in
		libc.so.6 | libm.so.6 | libdl.so.2 | libpthread.so.0 | librt.so.1 | ld-linux-*.so.*) ;;
		*) problem "$b needs $lib, which the runtime image (glibc only) does not have" ;;
		esac
	done
	echo "image-check: $b needs: ${needed:-nothing}"
done

# 4. Versions and names agree.
gomod_go=$(sed -n 's/^go \([0-9]*\.[0-9]*\).*/\1/p' go.mod)
[[ ${arg[GO_VERSION]:-} == "$gomod_go" ]] || problem "Dockerfile GO_VERSION ${arg[GO_VERSION]:-unset} differs from go.mod's go $gomod_go"
kube_version=$(awk '$1 == "k8s.io/kubernetes" && $2 ~ /^v/ {print $2; exit}' cmd/kyb-scheduler/go.mod)
[[ " ${arg[SCHEDULER_LDFLAGS]:-} " == *" -X k8s.io/component-base/version.gitVersion=$kube_version "* ]] ||
	problem "Dockerfile SCHEDULER_LDFLAGS does not report k8s.io/kubernetes $kube_version, which cmd/kyb-scheduler/go.mod builds"
app_version=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' $chart/Chart.yaml)
[[ ${arg[VERSION]:-} == "$app_version" ]] || problem "Dockerfile VERSION ${arg[VERSION]:-unset} differs from the chart's appVersion $app_version"
[[ -z $version || $version == "$app_version" ]] || problem "Makefile VERSION $version differs from the chart's appVersion $app_version"
repo=$(sed -n '/^image:/,/^[^ ]/s/^  repository: *\(.*\)$/\1/p' $chart/values.yaml)
[[ -z $image || $image == "$repo" ]] || problem "Makefile IMAGE $image differs from the chart's image.repository $repo"
tag=$(sed -n '/^image:/,/^[^ ]/s/^  tag: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' $chart/values.yaml)
[[ -z $tag ]] || problem "the chart's image.tag is \"$tag\"; leave it empty so that it follows appVersion"
grep -qE '^COPY --from=build /out/ /usr/local/bin/$' Dockerfile || problem "the Dockerfile does not put the binaries into /usr/local/bin/, where the chart runs them"
for b in $(grep -o '/usr/local/bin/kyb-[a-z-]*' $chart/templates/daemonset.yaml | sort -u); do
	name=$(basename "$b")
	[[ -d cmd/$name ]] || echo "image-check: note: the chart runs $b, but cmd/$name is not in this tree yet"
done

# 5. The runtime stage.
runtime=$(grep -E '^FROM ' Dockerfile | tail -1)
case $runtime in
*distroless/static* | *scratch*) problem "the runtime stage ($runtime) has no glibc, which cgo binaries and libnvidia-ml need" ;;
esac
grep -qE '^USER [1-9][0-9]*' Dockerfile || problem "the runtime stage sets no non-root USER"

# 6. The image without Docker.
"$(dirname "$0")/image-check-oci.sh" "$ctx" "$out" "${image:-$repo}" "${version:-$app_version}" "$archive" "${want_bins[@]}" || fail=1

if ((fail)); then
	echo "image-check: FAILED" >&2
	exit 1
fi
echo "image-check: ok (runtime $runtime, version $app_version)"
