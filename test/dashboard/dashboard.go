// Package dashboard renders the chart's Grafana dashboard without Grafana:
// each panel's queries are run by a real Prometheus, and the answers are
// drawn where the dashboard lays the panels out, as one HTML page a
// headless browser can photograph. It proves the dashboard's queries
// against live metrics and gives the docs a picture of them.
package dashboard

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Dashboard is the part of a Grafana dashboard that is drawn.
type Dashboard struct {
	Title  string  `json:"title"`
	Panels []Panel `json:"panels"`
}

// Panel is one panel.
type Panel struct {
	Type        string `json:"type"`
	Title       string `json:"title"`
	Description string `json:"description"`
	GridPos     struct {
		X, Y, W, H int
	} `json:"gridPos"`
	Targets []struct {
		RefID        string `json:"refId"`
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
		Instant      bool   `json:"instant"`
	} `json:"targets"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
		// Overrides set a table column's unit, by the column's name.
		Overrides []struct {
			Matcher struct {
				ID      string `json:"id"`
				Options string `json:"options"`
			} `json:"matcher"`
			Properties []struct {
				ID    string `json:"id"`
				Value any    `json:"value"`
			} `json:"properties"`
		} `json:"overrides"`
	} `json:"fieldConfig"`
	// Transformations name a table's value columns ("Value #A": the
	// column of query A).
	Transformations []struct {
		ID      string `json:"id"`
		Options struct {
			RenameByName map[string]string `json:"renameByName"`
		} `json:"options"`
	} `json:"transformations"`
}

// column is the name a table gives the values of query refID, and their
// unit.
func (p Panel) column(refID string) (name, unit string) {
	name = "Value #" + refID
	for _, t := range p.Transformations {
		if n, ok := t.Options.RenameByName[name]; ok {
			name = n
		}
	}
	unit = p.FieldConfig.Defaults.Unit
	for _, o := range p.FieldConfig.Overrides {
		if o.Matcher.ID != "byName" || o.Matcher.Options != name {
			continue
		}
		for _, prop := range o.Properties {
			if u, ok := prop.Value.(string); ok && prop.ID == "unit" {
				unit = u
			}
		}
	}
	return name, unit
}

// Load reads a dashboard file.
func Load(path string) (*Dashboard, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var d Dashboard
	if err := json.Unmarshal(raw, &d); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &d, nil
}

// Series is one answer of a query: its labels and its points.
type Series struct {
	Labels map[string]string
	Times  []float64
	Values []float64
}

// Prometheus runs queries on a Prometheus server's HTTP API.
type Prometheus struct {
	URL string
	// Vars replace the dashboard's variables ($node) in queries.
	Vars map[string]string
}

func (p Prometheus) expr(e string) string {
	for k, v := range p.Vars {
		e = strings.ReplaceAll(e, "$"+k, v)
	}
	return e
}

// Query runs an instant query (step 0) or a range query.
func (p Prometheus) Query(ctx context.Context, expr string, start, end time.Time, step time.Duration) ([]Series, error) {
	q := url.Values{"query": {p.expr(expr)}}
	path := "/api/v1/query"
	if step > 0 {
		path = "/api/v1/query_range"
		q.Set("start", strconv.FormatInt(start.Unix(), 10))
		q.Set("end", strconv.FormatInt(end.Unix(), 10))
		q.Set("step", strconv.Itoa(int(step.Seconds())))
	} else {
		q.Set("time", strconv.FormatInt(end.Unix(), 10))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL+path+"?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("query %q: %w", expr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Value  []any             `json:"value"`
				Values [][]any           `json:"values"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return nil, fmt.Errorf("query %q: %w: %s", expr, err, body)
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("query %q: %s", expr, r.Error)
	}
	var out []Series
	for _, res := range r.Data.Result {
		s := Series{Labels: res.Metric}
		points := res.Values
		if res.Value != nil {
			points = [][]any{res.Value}
		}
		for _, pt := range points {
			t, _ := pt[0].(float64)
			v, err := strconv.ParseFloat(fmt.Sprint(pt[1]), 64)
			if err != nil {
				continue
			}
			s.Times, s.Values = append(s.Times, t), append(s.Values, v)
		}
		out = append(out, s)
	}
	return out, nil
}

var legendVar = regexp.MustCompile(`\{\{\s*([a-zA-Z_]+)\s*\}\}`)

// Legend fills a legend format with a series' labels.
func Legend(format string, labels map[string]string) string {
	if format == "" {
		var parts []string
		for k, v := range labels {
			parts = append(parts, k+"="+v)
		}
		sort.Strings(parts)
		return strings.Join(parts, " ")
	}
	return legendVar.ReplaceAllStringFunc(format, func(m string) string {
		return labels[legendVar.FindStringSubmatch(m)[1]]
	})
}

// Format writes a value in a panel's unit.
func Format(v float64, unit string) string {
	switch unit {
	case "bytes":
		switch {
		case v >= 1<<30:
			return fmt.Sprintf("%.1f GiB", v/(1<<30))
		case v >= 1<<20:
			return fmt.Sprintf("%.0f MiB", v/(1<<20))
		}
		return fmt.Sprintf("%.0f B", v)
	case "percentunit":
		return fmt.Sprintf("%.0f%%", v*100)
	case "s":
		if v < 1 {
			return fmt.Sprintf("%.1f ms", v*1000)
		}
		return fmt.Sprintf("%.2f s", v)
	case "reqps":
		return fmt.Sprintf("%.2f/s", v)
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}
