package dashboard

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A table names its value columns as its organize transformation renames
// them and formats each in the unit its override gives that name, with a
// label column for each label its queries keep: the chart's two tables,
// drawn over answers of Prometheus's query API.
func TestTablesNameAndFormatTheirColumnsAsTheDashboardSays(t *testing.T) {
	d, err := Load("../../deployments/helm/kyb-dra-driver/dashboards/kyb-gpu-seats.json")
	if err != nil {
		t.Fatal(err)
	}
	const labels = `"node":"n1","namespace":"ns","pod":"p","container":"c","group":"G0","seat":"0"`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query().Get("query")
		l := labels
		if strings.Contains(q, "gpu)") {
			l += `,"gpu":"0"`
		}
		v := "0.25"
		if strings.Contains(strings.SplitN(q, "(kyb_", 2)[1], "bytes") {
			v = "21474836480"
		}
		_, _ = w.Write([]byte(`{"status":"success","data":{"result":[{"metric":{` + l + `},"value":[0,"` + v + `"]}]}}`))
	}))
	defer srv.Close()
	for title, want := range map[string]string{
		"Who holds which seat":      `<tr><th>node</th><th>namespace</th><th>pod</th><th>container</th><th>group</th><th>seat</th><th>memory</th><th>SM</th></tr><tr><td>n1</td><td>ns</td><td>p</td><td>c</td><td>G0</td><td>0</td><td>20.0 GiB</td><td>25%</td></tr>`,
		"Sized seats: size and use": `<tr><th>node</th><th>namespace</th><th>pod</th><th>container</th><th>group</th><th>seat</th><th>gpu</th><th>memory size</th><th>memory used</th><th>SM size</th><th>SM used</th></tr><tr><td>n1</td><td>ns</td><td>p</td><td>c</td><td>G0</td><td>0</td><td>0</td><td>20.0 GiB</td><td>20.0 GiB</td><td>25%</td><td>25%</td></tr>`,
	} {
		var p *Panel
		for i := range d.Panels {
			if d.Panels[i].Title == title {
				p = &d.Panels[i]
			}
		}
		if p == nil {
			t.Fatalf("no panel %q", title)
		}
		var b strings.Builder
		if err := table(context.Background(), &b, *p, Prometheus{URL: srv.URL}, time.Now()); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(b.String(), want) {
			t.Errorf("%s:\n%s\nwant\n%s", title, b.String(), want)
		}
	}
}
