#!/usr/bin/env bash
# Step 6 of hack/image-check.sh: the image built without Docker (make
# image-oci, test/cmd/kyb-image) against the Dockerfile, and against
# `docker save` of make image's where a Docker engine answers.
#
# Usage: hack/image-check-oci.sh CONTEXT OUT IMAGE VERSION ARCHIVE BINARY...
#   CONTEXT  the build context image-check.sh made (the Dockerfile's COPY sources)
#   OUT      where image-check.sh ran the Dockerfile's go build
#   ARCHIVE  make's archive, to be the same image; "" for none
set -euo pipefail
cd "$(dirname "$0")/.."
ctx=$1 out=$2 image=$3 version=$4 archive=${5:+$(realpath "$5")}
shift 5
bins=("$@")
GO=${GO:-go}
DOCKER=${DOCKER:-docker}
fail=0
problem() { echo "image-check: $*" >&2; fail=1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
kyb_image() { (cd test && "$GO" run ./cmd/kyb-image "$@"); }

# The runtime stage, read here without kyb-image's parser: continuation
# lines joined, what follows the last FROM.
runtime=$(sed -e ':a' -e '/\\$/{N;s/\\\n//;ta' -e '}' Dockerfile | awk '/^FROM /{buf=""} {buf = buf $0 "\n"} END {printf "%s", buf}')
declare -A arg
while IFS= read -r line; do
	if [[ $line =~ ^ARG[[:space:]]+([A-Za-z_]+)=\"?([^\"]*)\"?$ ]]; then
		arg[${BASH_REMATCH[1]}]=${BASH_REMATCH[2]}
	fi
done < Dockerfile
arg[VERSION]=$version
expand() {
	local v=$1 n
	for n in "${!arg[@]}"; do
		v=${v//\$\{$n\}/${arg[$n]}}
		v=${v//\$$n/${arg[$n]}}
	done
	printf '%s' "$v"
}
# want_config prints the USER, ENTRYPOINT and LABELs as kyb-image inspect
# prints an image's.
want_config() {
	local line rest key val
	while IFS= read -r line; do
		case $line in
		USER\ *) echo "user $(expand "${line#USER }" | xargs)" ;;
		ENTRYPOINT\ *) sed -E 's/^ENTRYPOINT[[:space:]]+/entrypoint /; s/",[[:space:]]*"/","/g; s/\[[[:space:]]+/[/; s/[[:space:]]+\]/]/' <<<"$line" ;;
		LABEL\ *)
			rest=${line#LABEL }
			while [[ $rest =~ ^[[:space:]]*([^=[:space:]]+)=(\"(([^\"\\]|\\.)*)\"|([^[:space:]\"]*))(.*)$ ]]; do
				key=${BASH_REMATCH[1]} rest=${BASH_REMATCH[6]}
				if [[ ${BASH_REMATCH[2]} == \"* ]]; then val=${BASH_REMATCH[3]}; else val=${BASH_REMATCH[5]}; fi
				val=${val//\\\"/\"}
				echo "label $key=$(expand "$val")"
			done
			[[ -z ${rest//[[:space:]]/} ]] || echo "label-unreadable $rest"
			;;
		esac
	done <<<"$runtime" | sort
}
config_of() { grep -E '^(user|entrypoint|label) ' "$1" | sort; }

# The image without Docker, from the same context as step 2.
oci=$tmp/image.oci.tar
if ! kyb_image build -context "$ctx" -dockerfile "$PWD/Dockerfile" -image "$image:$version" -build-arg "VERSION=$version" \
	-debs "$PWD/_output/image/debs" -o "$oci" 2>"$tmp/build.log"; then
	cat "$tmp/build.log" >&2
	problem "kyb-image could not build the image without Docker"
	exit 1
fi
kyb_image inspect -under usr/local/bin "$oci" >"$tmp/oci.txt"
digest=$(sed -n 's/^digest //p' "$tmp/oci.txt")

for b in "${bins[@]}"; do
	printf 'file usr/local/bin/%s %04o 0:0 sha256:%s\n' "$b" "$((8#$(stat -c %a "$out/$b")))" "$(sha256sum "$out/$b" | cut -d' ' -f1)"
done | sort >"$tmp/want-files.txt"
if ! diff -u "$tmp/want-files.txt" <(grep '^file ' "$tmp/oci.txt" | sort) >"$tmp/files.diff"; then
	problem "the OCI image's /usr/local/bin is not what the Dockerfile's go build made (- Dockerfile's, + OCI image's):"
	cat "$tmp/files.diff" >&2
fi
if ! diff -u <(want_config) <(config_of "$tmp/oci.txt") >"$tmp/config.diff"; then
	problem "the OCI image's configuration is not the Dockerfile's runtime stage's (- Dockerfile, + OCI image):"
	cat "$tmp/config.diff" >&2
fi
((fail)) || echo "image-check: OCI image $image:$version $digest: ${#bins[@]} binaries and the configuration as the Dockerfile's"

if [[ -n $archive ]]; then
	made=$(kyb_image inspect -under usr/local/bin "$archive" | sed -n 's/^digest //p')
	if [[ $made == "$digest" ]]; then
		echo "image-check: $archive: the same image ($made)"
	else
		problem "$archive is image $made; built again here it is $digest: the build is not reproducible"
	fi
fi

if "$DOCKER" info >/dev/null 2>&1; then
	if "$DOCKER" image inspect "$image:$version" >/dev/null 2>&1; then
		"$DOCKER" save -o "$tmp/docker.tar" "$image:$version"
		kyb_image inspect -under usr/local/bin -extract "$tmp/docker-bin" "$tmp/docker.tar" >"$tmp/docker.txt"
		if ! diff -u <(config_of "$tmp/docker.txt") <(config_of "$tmp/oci.txt") >"$tmp/docker-config.diff"; then
			problem "docker's $image:$version and the OCI image differ in configuration (- docker, + OCI):"
			cat "$tmp/docker-config.diff" >&2
		fi
		if ! diff -u <(awk '$1 == "file" {print $2, $3, $4}' "$tmp/docker.txt") <(awk '$1 == "file" {print $2, $3, $4}' "$tmp/oci.txt") >"$tmp/docker-files.diff"; then
			problem "docker's $image:$version and the OCI image differ in the names or modes of /usr/local/bin (- docker, + OCI):"
			cat "$tmp/docker-files.diff" >&2
		elif ! diff <(grep '^file ' "$tmp/docker.txt") <(grep '^file ' "$tmp/oci.txt") >/dev/null; then
			# Another Go release or gcc in the golang image: compare how
			# the binaries were built instead.
			for b in "${bins[@]}"; do
				echo "image-check: note: $b differs in bytes: docker's $("$GO" version "$tmp/docker-bin/$b" | cut -d' ' -f2), this machine's $("$GO" version "$out/$b" | cut -d' ' -f2)"
				if ! diff -u <("$GO" version -m "$tmp/docker-bin/$b" | tail -n +2) <("$GO" version -m "$out/$b" | tail -n +2) >"$tmp/buildinfo.diff"; then
					problem "$b: docker's and the OCI image's were built differently (go version -m; - docker, + OCI):"
					cat "$tmp/buildinfo.diff" >&2
				fi
			done
		else
			echo "image-check: docker's $image:$version has the same binaries, byte for byte"
		fi
	else
		echo "image-check: note: Docker answers but has no $image:$version to compare: make image builds it"
	fi
fi
exit $fail
