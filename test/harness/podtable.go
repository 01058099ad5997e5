package harness

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PodsWide is `kubectl get pods -o wide` of a namespace: the API server's
// own table of its pods (the server-side printing kubectl shows), every
// column, names upper-cased as kubectl prints them.
func (c *Cluster) PodsWide(ns string) (string, error) {
	raw, err := c.Client.CoreV1().RESTClient().Get().Namespace(ns).Resource("pods").
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").
		DoRaw(c.Ctx)
	if err != nil {
		return "", fmt.Errorf("pods of %s as a table: %w", ns, err)
	}
	var table metav1.Table
	if err := json.Unmarshal(raw, &table); err != nil {
		return "", fmt.Errorf("pods of %s as a table: %w", ns, err)
	}
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 8, 3, ' ', 0)
	var head []string
	for _, col := range table.ColumnDefinitions {
		head = append(head, strings.ToUpper(col.Name))
	}
	fmt.Fprintln(w, strings.Join(head, "\t"))
	for _, row := range table.Rows {
		cells := make([]string, len(row.Cells))
		for i, cell := range row.Cells {
			cells[i] = fmt.Sprint(cell)
		}
		fmt.Fprintln(w, strings.Join(cells, "\t"))
	}
	if err := w.Flush(); err != nil {
		return "", err
	}
	return b.String(), nil
}
