package planner

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
)

// Sizes is what one group of a sized profile offers its claims: at most
// Seats of them (its MPS daemon's clients), each holding memory on every
// GPU of the group and a share of their SMs.
type Sizes struct {
	Seats int64
	// Memory is in bytes per GPU of the group: a claim's memory is held
	// on each of its GPUs.
	Memory SizeRange
	// Compute is in per cent of each GPU's SMs.
	Compute SizeRange
}

// SizeRange is one capacity of a sized group: its whole, and what a
// claim may ask of it (min plus whole steps) or gets when it asks none.
type SizeRange struct {
	Capacity, Default, Min, Step int64
}

// Fits reports whether v is a size a claim may hold: min plus whole
// steps (or the default), within the capacity.
func (r SizeRange) Fits(v int64) bool {
	return v <= r.Capacity && (v == r.Default || v1alpha1.OnStep(v, r.Min, r.Step))
}

// Sizes is what the group offers, false where its profile is not sized.
// A default the configuration leaves out is the group's equal share.
func (g *Group) Sizes() (Sizes, bool) {
	rules := g.Profile.Sizes
	if rules == nil {
		return Sizes{}, false
	}
	s := Sizes{
		Seats:   int64(g.Seats()),
		Memory:  sizeRange(rules.Memory, g.MemoryMiB<<20, g.Seats()),
		Compute: sizeRange(rules.Compute, v1alpha1.MaxCompute, g.Seats()),
	}
	return s, true
}

func sizeRange(r v1alpha1.SizeRule, capacity int64, seats int) SizeRange {
	def := r.Default
	if def == 0 {
		def = r.EqualShare(capacity, seats)
	}
	return SizeRange{Capacity: capacity, Default: def, Min: r.Min, Step: r.Step}
}

// checkSizes refuses a sized profile whose memory does not fit a group's
// GPUs: a default above the GPU's memory, or a first step past it (the API
// server refuses such a request policy). What needs no node,
// v1alpha1.NodeConfig.Validate checked.
func checkSizes(prof *Profile, path *field.Path, errs *v1alpha1.FieldErrors) {
	if prof.Sizes == nil {
		return
	}
	memPath := path.Child("sharing", "sizes", "memory")
	for _, g := range prof.Groups {
		s, _ := g.Sizes()
		m := s.Memory
		gpus := "GPU " + g.GPUList()
		if len(g.GPUs) > 1 {
			gpus = "each GPU of group " + g.Name + " (GPUs " + g.GPUList() + ")"
		}
		switch {
		case m.Default > m.Capacity:
			errs.Add(memPath.Child("default"), "%s is more than the %s of %s", quantity(m.Default), quantity(m.Capacity), gpus)
			return
		case m.Min+m.Step > m.Capacity:
			errs.Add(memPath.Child("min"), "min %s plus one step %s is more than the %s of %s", quantity(m.Min), quantity(m.Step), quantity(m.Capacity), gpus)
			return
		}
	}
}

func quantity(bytes int64) string {
	return resource.NewQuantity(bytes, resource.BinarySI).String()
}

func (s Sizes) String() string {
	return fmt.Sprintf("memory %s per GPU (default %s, min %s, step %s), compute %d %% (default %d)",
		quantity(s.Memory.Capacity), quantity(s.Memory.Default), quantity(s.Memory.Min), quantity(s.Memory.Step), s.Compute.Capacity, s.Compute.Default)
}
