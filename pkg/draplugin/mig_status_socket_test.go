package draplugin_test

import (
	"encoding/json"
	"strings"
	"testing"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
)

func TestMIGClaimStatusNamesItsInstanceOverSockets(t *testing.T) {
	e := newEnv(t, "dgx-h100", migConfig, withMIG(&crashPoint{}))
	claim := e.claim(classMIG1g)
	ids := e.prepareOK(claim)
	env, _ := e.container(ids...)
	uuid := env["CUDA_VISIBLE_DEVICES"]
	if !strings.HasPrefix(uuid, "MIG-") {
		t.Fatalf("CUDA_VISIBLE_DEVICES=%q, want a MIG device", uuid)
	}
	stored := e.waitStatus(claim)
	if len(stored.Status.Devices) != 1 || stored.Status.Devices[0].Device != "g0-mig-1g-10gb-6" {
		t.Fatalf("status.devices %+v", stored.Status.Devices)
	}
	var st struct {
		v1alpha1.SeatStatus
		MIGDeviceUUID string `json:"migDeviceUUID"`
	}
	if err := json.Unmarshal(stored.Status.Devices[0].Data.Raw, &st); err != nil {
		t.Fatal(err)
	}
	if st.MIGDeviceUUID != uuid || st.Group != "G0" || len(st.Seats) != 1 || st.Seats[0] != 6 || st.Generations[0] != 1 {
		t.Errorf("status data %s, want seat 6 of G0 with migDeviceUUID %s", stored.Status.Devices[0].Data.Raw, uuid)
	}
}
