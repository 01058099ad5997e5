// Command kyb-dashboard draws the chart's Grafana dashboard from a live
// Prometheus into an HTML page (hack/dashboard-picture.sh photographs it).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/kyb-ai/kyb-dra-driver/test/dashboard"
)

func main() {
	file := flag.String("dashboard", "deployments/helm/kyb-dra-driver/dashboards/kyb-gpu-seats.json", "the dashboard JSON")
	prom := flag.String("prometheus", "http://127.0.0.1:9090", "the Prometheus server")
	span := flag.Duration("span", 10*time.Minute, "the time range drawn, up to now")
	out := flag.String("o", "dashboard.html", "the page to write")
	note := flag.String("note", "", "a line under the panels saying where the figures came from")
	flag.Parse()
	if err := run(*file, *prom, *out, *note, *span); err != nil {
		fmt.Fprintln(os.Stderr, "kyb-dashboard:", err)
		os.Exit(1)
	}
}

func run(file, prom, out, note string, span time.Duration) error {
	d, err := dashboard.Load(file)
	if err != nil {
		return err
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	p := dashboard.Prometheus{URL: prom, Vars: map[string]string{"node": ".*", "namespace": ".*"}}
	if err := dashboard.Render(context.Background(), f, d, p, time.Now(), span, note); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
