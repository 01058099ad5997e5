package main

import (
	"testing"

	utilfeature "k8s.io/apiserver/pkg/util/feature"
	logsapi "k8s.io/component-base/logs/api/v1"
)

// kube-scheduler's main registers the JSON log format; kyb-scheduler's
// imports the same registrations, so --logging-format=json works here too.
func TestJSONLoggingFormatIsRegistered(t *testing.T) {
	c := logsapi.NewLoggingConfiguration()
	c.Format = "json"
	if errs := logsapi.Validate(c, utilfeature.DefaultFeatureGate, nil); len(errs) > 0 {
		t.Errorf("kyb-scheduler --logging-format=json: %v", errs.ToAggregate())
	}
}
