package seatkind

import (
	"errors"
	"testing"
)

// A kind's failure keeps its message and what it wraps, and tells which
// kind it is, for the metric that counts it.
func TestFailedTellsTheKindAndKeepsTheError(t *testing.T) {
	inner := errors.New("device g0-mig-1g-10gb-6: ERROR_INSUFFICIENT_RESOURCES")
	err := Failed(ErrMIG, inner)
	if err.Error() != inner.Error() {
		t.Errorf("message %q, want %q", err, inner)
	}
	if !errors.Is(err, ErrMIG) || errors.Is(err, ErrSharing) {
		t.Errorf("kind: MIG %t, sharing %t; want MIG only", errors.Is(err, ErrMIG), errors.Is(err, ErrSharing))
	}
	if !errors.Is(err, inner) {
		t.Error("the failure does not wrap the kind's error")
	}
	if Failed(ErrSharing, nil) != nil {
		t.Error("no error failed")
	}
}
