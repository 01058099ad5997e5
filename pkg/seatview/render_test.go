package seatview_test

import (
	"encoding/json"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/seatview"
)

// withAttribute returns node-a's slices with one string attribute of
// device g01-2x set to value.
func withAttribute(t *testing.T, name v1alpha1.AttributeName, value string) []resourceapi.ResourceSlice {
	t.Helper()
	resourceSlices := generation(t, "node-a", seed, draresources.LayoutShared, 1, "a")
	for i := range resourceSlices {
		for j := range resourceSlices[i].Spec.Devices {
			if d := &resourceSlices[i].Spec.Devices[j]; d.Name == "g01-2x" {
				d.Attributes[resourceapi.QualifiedName(name)] = resourceapi.DeviceAttribute{StringValue: &value}
				return resourceSlices
			}
		}
	}
	t.Fatal("no device g01-2x")
	return nil
}

func table(t *testing.T, v *seatview.View, wide bool) string {
	t.Helper()
	var out strings.Builder
	if err := seatview.WriteTable(&out, v, wide); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// A slice's attribute is any string its driver writes. Printed raw, a
// newline and tabs in it would make rows of their own: here a node with a
// free group that does not exist. Every cell escapes what is not printable.
func TestTableCellsCannotForgeRows(t *testing.T) {
	forged := "G01\nNODE node-99\nDEVICE\tGROUP\tPROFILE\tGPUS\tSEATS\tHELD\tSTATE\tHELD BY\ng99-8x\tG99\t8x\t0,1,2,3,4,5,6,7\t8\t0\tfree\t-"
	for _, wide := range []bool{false, true} {
		plain := table(t, seatview.Build(withAttribute(t, v1alpha1.AttrGroup, "G01"), nil, seatview.Options{}), wide)
		got := table(t, seatview.Build(withAttribute(t, v1alpha1.AttrGroup, forged), nil, seatview.Options{}), wide)
		for _, line := range strings.Split(got, "\n") {
			if strings.HasPrefix(line, "NODE node-99") || strings.HasPrefix(line, "g99-8x") {
				t.Errorf("wide %v: a forged row %q in\n%s", wide, line, got)
			}
		}
		if strings.Count(got, "\n") != strings.Count(plain, "\n") {
			t.Errorf("wide %v: %d lines, %d with an ordinary group name:\n%s", wide, strings.Count(got, "\n"), strings.Count(plain, "\n"), got)
		}
		escaped := `G01\nNODE node-99\nDEVICE\tGROUP\tPROFILE\tGPUS\tSEATS\tHELD\tSTATE\tHELD BY\ng99-8x\tG99\t8x\t0,1,2,3,4,5,6,7\t8\t0\tfree\t-`
		if !strings.Contains(got, "g01-2x  "+escaped+"  2x") {
			t.Errorf("wide %v: the group's cell is not %s:\n%s", wide, escaped, got)
		}
	}

	// -o json is exact: encoding/json escapes, the reader gets the text.
	var out strings.Builder
	if err := seatview.WriteJSON(&out, seatview.Build(withAttribute(t, v1alpha1.AttrGroup, forged), nil, seatview.Options{})); err != nil {
		t.Fatal(err)
	}
	var v seatview.View
	if err := json.Unmarshal([]byte(out.String()), &v); err != nil {
		t.Fatal(err)
	}
	if g := group(t, &v, "node-a", "g01-2x"); g.Group != forged || len(v.Nodes) != 1 {
		t.Errorf("JSON: group %q, %d nodes; want the attribute as it is, 1 node", g.Group, len(v.Nodes))
	}
}

// What a cell escapes, as strconv.Quote writes it, and what it leaves.
func TestTableCellEscapes(t *testing.T) {
	for _, tc := range []struct{ value, cell string }{
		{"nvlink", "nvlink"},
		{"naïve ünïcode 日本", "naïve ünïcode 日本"},
		{`a\b "quoted"`, `a\b "quoted"`},
		{"a\tb", `a\tb`},
		{"a\r\nb", `a\r\nb`},
		{"\x1b[31mred", `\x1b[31mred`},
		{"bell\a\v\f", `bell\a\v\f`},
		{"\x7f\u0085", `\x7f\u0085`},
		{"left\u202eright", `left\u202eright`},
		{"no\u00a0break\u2028line", `no\u00a0break\u2028line`},
		{"bad\xffutf8\xc3", `bad\xffutf8\xc3`},
	} {
		got := table(t, seatview.Build(withAttribute(t, v1alpha1.AttrInterconnect, tc.value), nil, seatview.Options{}), true)
		var line string
		for _, l := range strings.Split(got, "\n") {
			if strings.HasPrefix(l, "g01-2x ") {
				line = l
			}
		}
		if fields := strings.Fields(line); len(fields) < 5 || !strings.Contains(line, "  "+tc.cell+"  ") {
			t.Errorf("interconnect %q: row %q, want the cell %s", tc.value, line, tc.cell)
		}
	}
}
