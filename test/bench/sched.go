package bench

import (
	"context"
	"errors"

	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// SchedOptions size the kube-scheduler study.
type SchedOptions struct {
	Nodes  int
	Pods   int
	Rounds int
}

// SchedStudy is the kube-scheduler study's result.
type SchedStudy struct{}

// RunSched is not written yet.
func RunSched(ctx context.Context, c *harness.Cluster, opts SchedOptions) (*SchedStudy, error) {
	return nil, errors.New("not yet")
}

// Table summarises the study.
func (s *SchedStudy) Table() *Table { return &Table{} }
