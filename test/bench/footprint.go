package bench

import (
	"context"
	"errors"

	"github.com/kyb-ai/kyb-dra-driver/test/harness"
)

// FootprintOptions configure the footprint study.
type FootprintOptions struct {
	Plugin string
	Cycles int
}

// FootprintStudy is the footprint study's result.
type FootprintStudy struct{}

// RunFootprint is not written yet.
func RunFootprint(ctx context.Context, c *harness.Cluster, opts FootprintOptions) (*FootprintStudy, error) {
	return nil, errors.New("not yet")
}

// Table summarises the study.
func (s *FootprintStudy) Table() *Table { return &Table{} }
