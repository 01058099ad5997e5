#!/usr/bin/env bash
# Gets what a real node needs, from Debian packages and the Go module proxy
# only, into one directory: hack/node-tools.sh DIR.
#
#   runc, podman, busybox   Debian packages (installed when missing)
#   CNI plugins, nft, iptables   Debian packages: the pod network (bridge and
#                           host-local in /usr/lib/cni) and kube-proxy's rules
#   containerd, ctr, containerd-shim-runc-v2   go install, CONTAINERD_VERSION
#   kubelet, kube-proxy     built from the test module (its k8s.io/kubernetes)
#   pause                   the kubelet's pause.c from that module, static
#   busybox                 the Debian static busybox, copied
#
# Each binary is rebuilt only when its version changed, so a second run
# takes seconds.
set -euo pipefail
dir=$1
GO=${GO:-go}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.2.9}
E2E_LDFLAGS=${E2E_LDFLAGS:-}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)

need=()
command -v runc >/dev/null || need+=(runc)
command -v podman >/dev/null || need+=(podman)
for pkg in busybox-static containernetworking-plugins nftables iptables; do
	dpkg-query -W -f '${Status}' "$pkg" 2>/dev/null | grep -q 'ok installed' || need+=("$pkg")
done
if ((${#need[@]})); then
	if [[ $(id -u) != 0 ]]; then
		echo "node-tools: missing Debian packages ${need[*]}; install them as root" >&2
		exit 1
	fi
	echo "node-tools: installing ${need[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

for cmd in containerd ctr containerd-shim-runc-v2; do
	"$root/hack/go-tool.sh" "$dir/$cmd" "github.com/containerd/containerd/v2/cmd/$cmd" "$CONTAINERD_VERSION"
done

# The kubelet and kube-proxy are the test module's tools: the same
# k8s.io/kubernetes as the in-process control plane they join.
kver=$(cd "$root/test" && $GO list -m -f '{{.Version}}' k8s.io/kubernetes)
for cmd in kubelet kube-proxy; do
	if ! [[ -x $dir/$cmd ]] || [[ $(cat "$dir/$cmd.version" 2>/dev/null) != "$kver" ]]; then
		echo "node-tools: building $cmd $kver (once)"
		(cd "$root/test" && $GO build -ldflags "$E2E_LDFLAGS" -o "$dir/$cmd" "k8s.io/kubernetes/cmd/$cmd")
		echo "$kver" >"$dir/$cmd.version"
	fi
done
if ! [[ -x $dir/pause ]] || [[ $(cat "$dir/pause.version" 2>/dev/null) != "$kver" ]]; then
	src=$(cd "$root/test" && $GO list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c
	gcc -Os -static -DVERSION="$kver" -o "$dir/pause" "$src"
	echo "$kver" >"$dir/pause.version"
fi
cp -f /bin/busybox "$dir/busybox"
echo "node-tools: ready in $dir"
