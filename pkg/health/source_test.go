package health

import "testing"

func TestOfGPUs(t *testing.T) {
	faults := map[int]Fault{
		3: {Kind: KindXID, Message: "XID 79 (GPU has fallen off the bus)"},
		1: {Kind: KindECC, Message: "double-bit (uncorrectable) ECC error"},
	}
	tests := []struct {
		name    string
		gpus    []int
		healthy bool
		message string
	}{
		{name: "no GPU faulty", gpus: []int{0, 2}, healthy: true},
		{name: "one GPU faulty", gpus: []int{2, 3}, message: "GPU 3: XID 79 (GPU has fallen off the bus)"},
		{name: "two GPUs faulty, in GPU order", gpus: []int{3, 2, 1, 0}, message: "GPU 1: double-bit (uncorrectable) ECC error; GPU 3: XID 79 (GPU has fallen off the bus)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			healthy, msg := OfGPUs(tt.gpus, faults)
			if healthy != tt.healthy || msg != tt.message {
				t.Errorf("OfGPUs(%v) = %v, %q; want %v, %q", tt.gpus, healthy, msg, tt.healthy, tt.message)
			}
		})
	}
}

func TestViewWithoutSourceIsHealthyAndQuiet(t *testing.T) {
	var v View
	if f := v.Faults(); len(f) != 0 {
		t.Errorf("Faults() = %v without a source", f)
	}
	ch, unsubscribe := v.Subscribe()
	defer unsubscribe()
	select {
	case <-ch:
		t.Error("a view without a source reported a change")
	default:
	}
}
