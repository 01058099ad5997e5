package placement

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
)

func TestDecodeArgs(t *testing.T) {
	for _, tc := range []struct {
		name    string
		obj     runtime.Object
		want    Args
		wantErr []string
	}{
		{name: "none: pack", obj: nil, want: Args{DefaultPolicy: Pack}},
		{name: "empty: pack", obj: &runtime.Unknown{}, want: Args{DefaultPolicy: Pack}},
		{
			name: "JSON",
			obj:  &runtime.Unknown{Raw: []byte(`{"defaultPolicy":"spread","deviceClassPolicies":{"gpu-4x-seat.kyb.ai":"topology"}}`), ContentType: runtime.ContentTypeJSON},
			want: Args{DefaultPolicy: Spread, DeviceClassPolicies: map[string]Policy{"gpu-4x-seat.kyb.ai": Topology}},
		},
		{
			name: "YAML",
			obj:  &runtime.Unknown{Raw: []byte("defaultPolicy: topology\n"), ContentType: runtime.ContentTypeYAML},
			want: Args{DefaultPolicy: Topology},
		},
		{
			name:    "unknown field",
			obj:     &runtime.Unknown{Raw: []byte(`{"defaultPolcy":"spread"}`)},
			wantErr: []string{"KybPlacement args", `unknown field "defaultPolcy"`},
		},
		{
			name:    "unknown default policy",
			obj:     &runtime.Unknown{Raw: []byte(`{"defaultPolicy":"binpack"}`)},
			wantErr: []string{"KybPlacement args", "defaultPolicy", `"binpack"`, `"pack", "topology", "spread"`},
		},
		{
			name:    "unknown class policy",
			obj:     &runtime.Unknown{Raw: []byte(`{"deviceClassPolicies":{"gpu-1x-seat.kyb.ai":"first-fit"}}`)},
			wantErr: []string{"deviceClassPolicies[gpu-1x-seat.kyb.ai]", `"first-fit"`},
		},
		{
			name:    "empty class name",
			obj:     &runtime.Unknown{Raw: []byte(`{"deviceClassPolicies":{"":"pack"}}`)},
			wantErr: []string{"deviceClassPolicies", "may not be empty"},
		},
		{
			name:    "not the arguments' encoding",
			obj:     &resourceapi.DeviceClass{},
			wantErr: []string{"KybPlacement args", "want runtime.Unknown"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := DecodeArgs(tc.obj)
			if len(tc.wantErr) > 0 {
				if err == nil {
					t.Fatalf("no error, got %+v", got)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q does not say %s", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// The score reads what the driver publishes by name: the names must be
// the driver's, and the largest pool it scores the driver's largest.
func TestPublishedNamesAreTheDriversOwn(t *testing.T) {
	if !slices.Equal(largerSizes[:], v1alpha1.ValidGroupSizes[1:]) {
		t.Errorf("larger group sizes %v, the driver's group sizes are %v", largerSizes, v1alpha1.ValidGroupSizes)
	}
	if gpuIndexLimit != planner.MaxGPUs {
		t.Errorf("GPU indices below %d read, the driver publishes up to %d GPUs", gpuIndexLimit, planner.MaxGPUs)
	}
	if maxPoolDevices != draresources.MaxPoolDevices() {
		t.Errorf("pools of up to %d devices scored, the driver publishes up to %d", maxPoolDevices, draresources.MaxPoolDevices())
	}
	if counterSet != draresources.CounterSet {
		t.Errorf("counter set %q, the driver publishes %q", counterSet, draresources.CounterSet)
	}
	if memoryCapacity != draresources.MemoryCapacity || computeCapacity != draresources.ComputeCapacity {
		t.Errorf("sized capacities %q and %q, the driver publishes %q and %q", memoryCapacity, computeCapacity, draresources.MemoryCapacity, draresources.ComputeCapacity)
	}
	if seatsCapacity != draresources.SeatsCapacity {
		t.Errorf("seats capacity %q, the driver publishes %q", seatsCapacity, draresources.SeatsCapacity)
	}
	if got := counterPrefix + "3"; got != draresources.CounterName(3) {
		t.Errorf("counter of GPU 3 %q, the driver publishes %q", got, draresources.CounterName(3))
	}
}
