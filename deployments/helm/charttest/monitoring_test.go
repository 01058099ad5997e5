//go:build charttest

package charttest

import (
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	sigsyaml "sigs.k8s.io/yaml"
)

// nodeConfigMap is the ConfigMap holding the node configuration.
func nodeConfigMap(t *testing.T, m *manifest) object {
	t.Helper()
	for _, o := range m.ofKind("ConfigMap") {
		if strings.HasSuffix(o.Name, "-config") {
			return o
		}
	}
	t.Fatal("no ConfigMap named *-config")
	return object{}
}

// scrapeEndpoint is what the ServiceMonitor's and PodMonitor's endpoints
// must say.
type scrapeEndpoint struct {
	Port        string `json:"port"`
	Path        string `json:"path"`
	Interval    string `json:"interval"`
	HonorLabels bool   `json:"honorLabels"`
	Relabelings []struct {
		SourceLabels []string `json:"sourceLabels"`
		TargetLabel  string   `json:"targetLabel"`
	} `json:"relabelings"`
}

func checkMonitoring(t *testing.T, m *manifest, tc chartCase) {
	ds := daemonSet(t, m)
	e := env(ds.Spec.Template.Spec.Containers[0])
	switch {
	case tc.deviceMode:
	case tc.noPodGPU:
		if e["KYB_GPU_USAGE_INTERVAL"].Value != "0" {
			t.Errorf("per-pod GPU metrics off, but KYB_GPU_USAGE_INTERVAL=%q", e["KYB_GPU_USAGE_INTERVAL"].Value)
		}
	default:
		if e["KYB_GPU_USAGE_INTERVAL"].Value != "10s" {
			t.Errorf("KYB_GPU_USAGE_INTERVAL=%q, want 10s", e["KYB_GPU_USAGE_INTERVAL"].Value)
		}
		if want := map[bool]string{false: "/host/proc", true: ""}[tc.simulated]; e["KYB_HOST_PROC"].Value != want {
			t.Errorf("KYB_HOST_PROC=%q, want %q", e["KYB_HOST_PROC"].Value, want)
		}
	}
	monitors := append(m.ofKind("ServiceMonitor"), m.ofKind("PodMonitor")...)
	dashboards := []object{}
	for _, o := range m.ofKind("ConfigMap") {
		if strings.HasSuffix(o.Name, "-dashboard") {
			dashboards = append(dashboards, o)
		}
	}
	if !tc.monitoring {
		if len(monitors) > 0 || len(dashboards) > 0 {
			t.Errorf("off by default, but rendered %d monitors and %d dashboards", len(monitors), len(dashboards))
		}
		return
	}
	if len(monitors) != 2 {
		t.Fatalf("%d monitors, want a ServiceMonitor and a PodMonitor", len(monitors))
	}
	for _, o := range monitors {
		var spec struct {
			Spec struct {
				Endpoints    []scrapeEndpoint `json:"endpoints"`
				PodEndpoints []scrapeEndpoint `json:"podMetricsEndpoints"`
			} `json:"spec"`
		}
		if err := sigsyaml.Unmarshal(o.Raw, &spec); err != nil {
			t.Fatal(err)
		}
		eps := slices.Concat(spec.Spec.Endpoints, spec.Spec.PodEndpoints)
		if len(eps) != 1 {
			t.Fatalf("%s: %d endpoints", o.Kind, len(eps))
		}
		ep := eps[0]
		// Without honorLabels, Prometheus renames the workload's namespace,
		// pod and container labels to exported_* and puts the plugin pod's
		// in their place.
		if ep.Port != "metrics" || !ep.HonorLabels || len(ep.Relabelings) != 1 ||
			!reflect.DeepEqual(ep.Relabelings[0].SourceLabels, []string{"__meta_kubernetes_pod_node_name"}) || ep.Relabelings[0].TargetLabel != "node" {
			t.Errorf("%s endpoint: %+v", o.Kind, ep)
		}
	}
	if len(dashboards) != 1 {
		t.Fatalf("%d dashboard ConfigMaps, want 1", len(dashboards))
	}
	var cm corev1.ConfigMap
	decode(t, dashboards[0], &cm)
	if cm.Labels["grafana_dashboard"] != "1" || cm.Namespace != "monitoring" {
		t.Errorf("dashboard ConfigMap: labels %v, namespace %q; want the sidecar's label in monitoring", cm.Labels, cm.Namespace)
	}
	raw, err := os.ReadFile(chartDir + "/dashboards/kyb-gpu-seats.json")
	if err != nil {
		t.Fatal(err)
	}
	if cm.Data["kyb-gpu-seats.json"] != strings.TrimRight(string(raw), "\n") {
		t.Error("the ConfigMap does not carry dashboards/kyb-gpu-seats.json as it is")
	}
	var dash struct {
		UID    string `json:"uid"`
		Panels []struct {
			Title      string `json:"title"`
			Datasource struct {
				UID string `json:"uid"`
			} `json:"datasource"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal([]byte(cm.Data["kyb-gpu-seats.json"]), &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	if dash.UID == "" || len(dash.Panels) == 0 {
		t.Errorf("dashboard: uid %q, %d panels", dash.UID, len(dash.Panels))
	}
	for _, p := range dash.Panels {
		if p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
			t.Errorf("panel %q: data source %q, %d queries; want the dashboard's data source variable and a query", p.Title, p.Datasource.UID, len(p.Targets))
		}
	}
}
