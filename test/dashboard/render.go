package dashboard

import (
	"context"
	"fmt"
	"html"
	"io"
	"math"
	"sort"
	"strings"
	"time"
)

// rowHeight is the pixels of one grid row, as Grafana draws them.
const rowHeight = 30

var palette = []string{"#73bf69", "#f2cc0c", "#5794f2", "#ff9830", "#f2495c", "#b877d9", "#8ab8ff", "#ff780a", "#96d98d", "#fade2a"}

// Render draws every panel of d with what its queries answer over
// [end-span, end], and a note saying where the figures came from.
func Render(ctx context.Context, w io.Writer, d *Dashboard, prom Prometheus, end time.Time, span time.Duration, note string) error {
	var b strings.Builder
	fmt.Fprintf(&b, `<!DOCTYPE html><html><head><meta charset="utf-8"><title>%s</title><style>
body{background:#111217;color:#ccccdc;font-family:Inter,Helvetica,Arial,sans-serif;margin:16px;width:1568px}
h1{font-size:20px;font-weight:500;margin:0 0 12px}
.grid{display:grid;grid-template-columns:repeat(24,1fr);grid-auto-rows:%dpx;gap:8px}
.panel{background:#181b1f;border:1px solid #2c3235;border-radius:2px;padding:8px 10px;overflow:hidden;display:flex;flex-direction:column}
.panel h2{font-size:13px;font-weight:500;margin:0 0 6px;color:#d8d9da}
.stats{display:flex;flex-wrap:wrap;gap:10px;flex:1;align-items:center}
.stat{flex:1;min-width:90px;text-align:center;border-radius:2px;padding:6px}
.stat .v{font-size:28px;font-weight:600;color:#fff}.stat .n{font-size:12px}
.legend{font-size:11px;display:flex;flex-wrap:wrap;gap:2px 12px;margin-top:4px}
.legend i{display:inline-block;width:12px;height:3px;margin-right:4px;vertical-align:middle}
table{border-collapse:collapse;font-size:12px;width:100%%}th,td{text-align:left;padding:3px 8px;border-bottom:1px solid #2c3235}
th{color:#6e9fff;font-weight:500}
.bar{display:flex;align-items:center;font-size:12px;margin:3px 0}.bar span{width:45%%;white-space:nowrap;overflow:hidden}
.bar div{height:14px;background:#5794f2;margin-right:6px}
.note{font-size:11px;color:#8e8e8e;margin-top:10px}
</style></head><body><h1>%s</h1><div class="grid">`, html.EscapeString(d.Title), rowHeight, html.EscapeString(d.Title))
	for _, p := range d.Panels {
		fmt.Fprintf(&b, `<div class="panel" style="grid-column:%d / span %d;grid-row:%d / span %d"><h2>%s</h2>`,
			p.GridPos.X+1, p.GridPos.W, p.GridPos.Y+1, p.GridPos.H, html.EscapeString(p.Title))
		var err error
		switch p.Type {
		case "timeseries":
			err = timeseries(ctx, &b, p, prom, end, span)
		case "table":
			err = table(ctx, &b, p, prom, end)
		case "bargauge":
			err = bars(ctx, &b, p, prom, end)
		default:
			err = stats(ctx, &b, p, prom, end)
		}
		if err != nil {
			return fmt.Errorf("panel %q: %w", p.Title, err)
		}
		b.WriteString(`</div>`)
	}
	fmt.Fprintf(&b, `</div><div class="note">%s</div></body></html>`, html.EscapeString(note))
	_, err := io.WriteString(w, b.String())
	return err
}

type drawn struct {
	name string
	s    Series
}

func instant(ctx context.Context, p Panel, prom Prometheus, end time.Time) ([]drawn, error) {
	var out []drawn
	for _, t := range p.Targets {
		res, err := prom.Query(ctx, t.Expr, end, end, 0)
		if err != nil {
			return nil, err
		}
		for _, s := range res {
			out = append(out, drawn{Legend(t.LegendFormat, s.Labels), s})
		}
	}
	return out, nil
}

func stats(ctx context.Context, b *strings.Builder, p Panel, prom Prometheus, end time.Time) error {
	res, err := instant(ctx, p, prom, end)
	if err != nil {
		return err
	}
	sort.Slice(res, func(i, j int) bool { return res[i].name < res[j].name })
	b.WriteString(`<div class="stats">`)
	for i, r := range res {
		fmt.Fprintf(b, `<div class="stat" style="background:%s33"><div class="v">%s</div><div class="n">%s</div></div>`,
			palette[i%len(palette)], Format(r.s.Values[0], p.FieldConfig.Defaults.Unit), html.EscapeString(r.name))
	}
	if len(res) == 0 {
		b.WriteString(`<div class="stat"><div class="v">0</div><div class="n">no data</div></div>`)
	}
	b.WriteString(`</div>`)
	return nil
}

func bars(ctx context.Context, b *strings.Builder, p Panel, prom Prometheus, end time.Time) error {
	res, err := instant(ctx, p, prom, end)
	if err != nil {
		return err
	}
	sort.Slice(res, func(i, j int) bool { return res[i].name < res[j].name })
	most := 1.0
	for _, r := range res {
		most = math.Max(most, r.s.Values[0])
	}
	for _, r := range res {
		color := "#5794f2"
		switch {
		case strings.HasSuffix(r.name, "blocked"):
			color = "#ff9830"
		case strings.HasSuffix(r.name, "unhealthy"):
			color = "#f2495c"
		}
		fmt.Fprintf(b, `<div class="bar"><span>%s</span><div style="width:%.0f%%;background:%s"></div>%s</div>`,
			html.EscapeString(r.name), 50*r.s.Values[0]/most, color, Format(r.s.Values[0], p.FieldConfig.Defaults.Unit))
	}
	return nil
}

func table(ctx context.Context, b *strings.Builder, p Panel, prom Prometheus, end time.Time) error {
	// The dashboard merges its queries on their labels: a row per label
	// set, a value column per query.
	type row struct {
		labels map[string]string
		values []string
	}
	rows := map[string]*row{}
	var keys []string
	present := map[string]bool{}
	for i, t := range p.Targets {
		res, err := prom.Query(ctx, t.Expr, end, end, 0)
		if err != nil {
			return err
		}
		_, unit := p.column(t.RefID)
		for _, s := range res {
			k := Legend("", s.Labels)
			r := rows[k]
			if r == nil {
				r = &row{labels: s.Labels, values: make([]string, len(p.Targets))}
				rows[k] = r
				keys = append(keys, k)
			}
			for l := range s.Labels {
				present[l] = true
			}
			r.values[i] = Format(s.Values[0], unit)
		}
	}
	sort.Strings(keys)
	var cols []string
	for _, c := range []string{"node", "namespace", "pod", "container", "group", "seat", "gpu"} {
		if present[c] {
			cols = append(cols, c)
		}
	}
	b.WriteString(`<table><tr>`)
	for _, c := range cols {
		fmt.Fprintf(b, `<th>%s</th>`, c)
	}
	for _, t := range p.Targets {
		name, _ := p.column(t.RefID)
		fmt.Fprintf(b, `<th>%s</th>`, html.EscapeString(name))
	}
	b.WriteString(`</tr>`)
	for _, k := range keys {
		r := rows[k]
		b.WriteString(`<tr>`)
		for _, c := range cols {
			fmt.Fprintf(b, `<td>%s</td>`, html.EscapeString(r.labels[c]))
		}
		for _, v := range r.values {
			fmt.Fprintf(b, `<td>%s</td>`, v)
		}
		b.WriteString(`</tr>`)
	}
	b.WriteString(`</table>`)
	return nil
}

func timeseries(ctx context.Context, b *strings.Builder, p Panel, prom Prometheus, end time.Time, span time.Duration) error {
	step := max(span/120, 5*time.Second)
	var all []drawn
	for _, t := range p.Targets {
		res, err := prom.Query(ctx, t.Expr, end.Add(-span), end, step)
		if err != nil {
			return err
		}
		for _, s := range res {
			all = append(all, drawn{Legend(t.LegendFormat, s.Labels), s})
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].name < all[j].name })
	const w, h, left = 720.0, 170.0, 70.0
	top := 0.0
	for _, d := range all {
		for _, v := range d.s.Values {
			if !math.IsNaN(v) {
				top = math.Max(top, v)
			}
		}
	}
	if top == 0 {
		top = 1
	}
	if p.FieldConfig.Defaults.Unit == "percentunit" {
		top = math.Max(top, 1)
	}
	top *= 1.1
	start := float64(end.Add(-span).Unix())
	x := func(t float64) float64 { return left + (t-start)/span.Seconds()*(w-left) }
	y := func(v float64) float64 { return h - v/top*h + 4 }
	fmt.Fprintf(b, `<svg viewBox="0 0 %.0f %.0f" width="100%%" style="flex:1">`, w, h+20)
	for i := 0; i <= 4; i++ {
		v := top / 1.1 * float64(i) / 4
		fmt.Fprintf(b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#2c3235"/><text x="%.0f" y="%.1f" fill="#8e8e8e" font-size="10" text-anchor="end">%s</text>`,
			left, w, y(v), y(v), left-6, y(v)+3, Format(v, p.FieldConfig.Defaults.Unit))
	}
	for i := 0; i <= 4; i++ {
		t := start + span.Seconds()*float64(i)/4
		fmt.Fprintf(b, `<text x="%.1f" y="%.0f" fill="#8e8e8e" font-size="10" text-anchor="middle">%s</text>`, x(t), h+18, time.Unix(int64(t), 0).UTC().Format("15:04"))
	}
	for i, d := range all {
		var pts []string
		for j := range d.s.Times {
			// Grafana leaves a gap where a query has no value (a quantile
			// of no prepares).
			if !math.IsNaN(d.s.Values[j]) {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(d.s.Times[j]), y(d.s.Values[j])))
			}
		}
		fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="1.6" points="%s"/>`, palette[i%len(palette)], strings.Join(pts, " "))
	}
	b.WriteString(`</svg><div class="legend">`)
	for i, d := range all {
		fmt.Fprintf(b, `<span><i style="background:%s"></i>%s</span>`, palette[i%len(palette)], html.EscapeString(d.name))
	}
	if len(all) == 0 {
		b.WriteString(`<span>no data</span>`)
	}
	b.WriteString(`</div>`)
	return nil
}
