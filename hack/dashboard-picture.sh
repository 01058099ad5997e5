#!/usr/bin/env bash
# Draws docs/img/dashboard.png (make dashboard-picture): the chart's Grafana
# dashboard over the demo's metrics. The demo runs (KEEP=1), a real
# Prometheus scrapes its nodes' plugins as the chart's PodMonitor would
# (honor_labels, a node label), pods come and go for a few minutes, then
# every panel's query is run on Prometheus and drawn where the dashboard
# lays it out (test/cmd/kyb-dashboard), and headless Chromium photographs
# the page. Grafana itself is not used: it is neither a Debian package nor
# buildable from the Go module proxy.
set -euo pipefail
cd "$(dirname "$0")/.."

NODES=${NODES:-dgx-h100,pcie-8gpu}
MINUTES=${MINUTES:-4}
OUT=${OUT:-docs/img/dashboard.png}

install() { # install <command> <debian package>
  command -v "$1" >/dev/null && return
  echo "installing $2"
  apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$2" >/dev/null
}
install prometheus prometheus
install chromium chromium

work=$(mktemp -d /tmp/kyb-dashboard-XXXXXX)
cleanup() {
  kill $(jobs -p) 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

(cd test && go build -o "$work/kyb-dashboard" ./cmd/kyb-dashboard)
KEEP=1 NODES=$NODES hack/demo.sh >"$work/demo.out" 2>"$work/demo.log" &
for _ in $(seq 600); do
  grep -q "Press Ctrl-C" "$work/demo.out" 2>/dev/null && break
  sleep 1
done
grep -q "Press Ctrl-C" "$work/demo.out" || { cat "$work/demo.out"; tail -50 "$work/demo.log"; exit 1; }
kubeconfig=$(sed -n 's/.*export KUBECONFIG=\([^ ]*\).*/\1/p' "$work/demo.out" | head -1)
kubectl() { KUBECONFIG=$kubeconfig PATH="$PWD/bin:$PATH" bin/kubectl "$@"; }

{
  echo "global: {scrape_interval: 5s, evaluation_interval: 5s}"
  echo "scrape_configs:"
  echo "- job_name: kyb-dra-plugin"
  echo "  honor_labels: true"
  echo "  static_configs:"
  sed -n 's|^  \(node-[0-9]*\) http://\([^/]*\)/metrics$|  - {targets: ["\2"], labels: {node: \1}}|p' "$work/demo.out"
} >"$work/prometheus.yml"
prometheus --config.file "$work/prometheus.yml" --storage.tsdb.path "$work/tsdb" \
  --web.listen-address 127.0.0.1:19090 >"$work/prometheus.log" 2>&1 &

# Pods come and go while Prometheus watches.
half=$((MINUTES * 30))
sleep "$half"
kubectl delete pod one-seat --wait=false >/dev/null 2>&1 || kubectl get pods >&2
sleep "$half"
kubectl apply -f demo/specs/01-one-seat.yaml >/dev/null 2>&1
sleep "$((half * 2))"

kubectl kyb seats -A >"$work/seats.txt"
cat "$work/seats.txt"
"$work/kyb-dashboard" -prometheus http://127.0.0.1:19090 -span "${MINUTES}m" -o "$work/dashboard.html" \
  -note "kyb GPU seats, deployments/helm/kyb-dra-driver/dashboards/kyb-gpu-seats.json: every panel's query run by Prometheus $(prometheus --version 2>&1 | sed -n 's/^prometheus, version \([^ ]*\).*/\1/p') scraping make demo KEEP=1 NODES=$NODES ($(date -u +%Y-%m-%d)), drawn by test/cmd/kyb-dashboard."
mkdir -p "$(dirname "$OUT")"
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1600,1580 \
  --screenshot="$PWD/$OUT" "file://$work/dashboard.html" >/dev/null 2>&1
echo "wrote $OUT"
