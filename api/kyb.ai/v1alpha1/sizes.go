package v1alpha1

import (
	"bytes"
	"encoding/json"
	"math"
	"reflect"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// A sized profile (sharing: {strategy: mps, sized: true}) lets each claim
// say how much of its group it needs: device memory on each GPU of the
// group and a share of the GPUs' SMs, as consumable capacities the
// scheduler's allocator counts and the group's MPS daemon enforces.
// SeatSizes says which sizes a claim may ask and what one that asks
// nothing gets; everything has a default that needs no node.

// The defaults of a sized profile's sizes. Below a GiB a CUDA client has
// little room beside its context; sizes in whole GiB and per cent are the
// units a quota counts, and fewer distinct sizes leave fewer unusable
// remainders on a busy group. A default size left out is the group's equal
// share (seatsPerGroup claims that ask nothing fill it), which depends on
// the GPU's memory and so is the planner's.
const (
	DefaultMemoryMin   = 1 << 30
	DefaultMemoryStep  = 1 << 30
	DefaultComputeMin  = 1
	DefaultComputeStep = 1
	// MaxCompute is all of a GPU's SMs, in per cent.
	MaxCompute = 100
)

// SeatSizes are the sizes a sized profile's claims may ask.
type SeatSizes struct {
	// Memory is device memory in bytes on each GPU of the group
	// (quantities such as 16Gi).
	Memory *MemorySizes `json:"memory,omitempty"`
	// Compute is the per cent of each GPU's SMs.
	Compute *ComputeSizes `json:"compute,omitempty"`
}

// MemorySizes bound the memory a claim may ask: at least Min, in Steps
// above it; Default is what a claim that asks none gets.
type MemorySizes struct {
	// Default: the group's equal share (1/seatsPerGroup of its GPU's
	// memory) rounded down to the step.
	Default Quantity `json:"default,omitempty"`
	// Min: 1Gi.
	Min Quantity `json:"min,omitempty"`
	// Step: 1Gi.
	Step Quantity `json:"step,omitempty"`
}

// ComputeSizes bound the share of SMs a claim may ask, in whole per
// cent.
type ComputeSizes struct {
	// Default: 100/seatsPerGroup rounded down to the step.
	Default *int64 `json:"default,omitempty"`
	// Min: 1.
	Min *int64 `json:"min,omitempty"`
	// Step: 1.
	Step *int64 `json:"step,omitempty"`
}

// Quantity is a resource quantity as Kubernetes writes one ("16Gi",
// "17179869184"), given as a string or a number; validation parses it.
type Quantity string

// UnmarshalJSON takes a string or a number.
func (q *Quantity) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	if len(data) > 0 && data[0] == '"' {
		var s string
		if err := json.Unmarshal(data, &s); err != nil {
			return err
		}
		*q = Quantity(s)
		return nil
	}
	var n json.Number
	if err := json.Unmarshal(data, &n); err != nil {
		return &json.UnmarshalTypeError{Value: jsonKind(data), Type: reflect.TypeFor[Quantity]()}
	}
	*q = Quantity(n.String())
	return nil
}

// jsonKind names what a JSON value is, as encoding/json's errors do.
func jsonKind(data []byte) string {
	switch {
	case len(data) == 0:
		return "nothing"
	case data[0] == '{':
		return "object"
	case data[0] == '[':
		return "array"
	case data[0] == 't' || data[0] == 'f':
		return "bool"
	}
	return "null"
}

// SizeRule is one capacity of a sized profile: Default 0 is the group's
// equal share.
type SizeRule struct {
	Default, Min, Step int64
}

// SizeRules are a sized profile's memory (bytes) and compute (per cent)
// rules, with every default filled that needs no node.
type SizeRules struct {
	Memory, Compute SizeRule
}

// IsSized says whether the profile's claims size their seats.
func (p *Profile) IsSized() bool {
	return p.Sharing != nil && p.Sharing.Sized
}

// SizeRules are the profile's size rules; false for a profile that is not
// sized. Values that do not parse (Validate refuses them) count as left
// out.
func (p *Profile) SizeRules() (SizeRules, bool) {
	if !p.IsSized() {
		return SizeRules{}, false
	}
	r := SizeRules{
		Memory:  SizeRule{Min: DefaultMemoryMin, Step: DefaultMemoryStep},
		Compute: SizeRule{Min: DefaultComputeMin, Step: DefaultComputeStep},
	}
	if s := p.Sharing.Sizes; s != nil {
		if m := s.Memory; m != nil {
			setBytes(&r.Memory.Default, m.Default)
			setBytes(&r.Memory.Min, m.Min)
			setBytes(&r.Memory.Step, m.Step)
		}
		if c := s.Compute; c != nil {
			setInt(&r.Compute.Default, c.Default)
			setInt(&r.Compute.Min, c.Min)
			setInt(&r.Compute.Step, c.Step)
		}
	}
	return r, true
}

func setBytes(to *int64, q Quantity) {
	if n, ok := bytesOf(q); ok {
		*to = n
	}
}

func setInt(to *int64, v *int64) {
	if v != nil {
		*to = *v
	}
}

// bytesOf parses a memory quantity into whole bytes; false when it is left
// out, does not parse or is not whole.
func bytesOf(q Quantity) (int64, bool) {
	if q == "" {
		return 0, false
	}
	v, err := resource.ParseQuantity(string(q))
	if err != nil {
		return 0, false
	}
	n, exact := v.AsInt64()
	return n, exact
}

// OnStep reports whether v is min plus a whole number of steps.
func OnStep(v, min, step int64) bool {
	return v >= min && step > 0 && (v-min)%step == 0
}

// Consumed is what a claim consumes of a capacity under the rule, as the
// scheduler's allocator computes it (k8s.io/dynamic-resource-allocation,
// structured, consumable capacity: fillEmptyRequest, roundUpRange): the
// default where the claim asks nothing (asked false), the minimum where
// it asks less, else what it asks rounded up to min plus a whole number
// of steps. requested is in the capacity's unit, a fraction rounded up
// (Quantity.Value): with a whole min and step the next step is the same.
// A size past what an int64 holds is math.MaxInt64, which no capacity
// fits (the allocator refuses such a request outright).
//
// kyb-scheduler predicts with it which group the allocator gives a sized
// claim; docs/design.md ("Sized seats") says what the allocator does.
func (r SizeRule) Consumed(requested int64, asked bool) int64 {
	switch {
	case !asked:
		return r.Default
	case requested <= r.Min:
		return r.Min
	case r.Step <= 0:
		return requested
	}
	n := (requested - r.Min) / r.Step
	if (requested-r.Min)%r.Step != 0 {
		n++
	}
	if r.Min >= 0 && n > (math.MaxInt64-r.Min)/r.Step {
		return math.MaxInt64
	}
	return r.Min + n*r.Step
}

// Allows reports whether v passes the rule as the allocator's request
// policy does: the default always, else min plus whole steps.
func (r SizeRule) Allows(v int64) bool {
	return v == r.Default || OnStep(v, r.Min, r.Step)
}

// EqualShare is 1/seats of capacity rounded down to the rule's step, at
// least its minimum: the size of a claim that asks nothing, where the
// rule sets no default.
func (r SizeRule) EqualShare(capacity int64, seats int) int64 {
	share := capacity / int64(max(seats, 1))
	if share <= r.Min || r.Step <= 0 {
		return r.Min
	}
	return r.Min + (share-r.Min)/r.Step*r.Step
}

func validateSized(p *Profile, path *field.Path, errs *FieldErrors) {
	s := p.Sharing
	if s.Sized && s.Strategy != SharingMPS {
		errs.Add(path.Child("sized"), "needs strategy %q: a seat's size is held by its MPS client's limits; strategy is %q", SharingMPS, p.SharingStrategy())
	}
	if s.Sizes == nil {
		return
	}
	sizesPath := path.Child("sizes")
	if !s.Sized {
		errs.Add(sizesPath, "applies to sized profiles only: set sized: true")
	}
	if m := s.Memory(); m != nil {
		validateMemorySizes(m, sizesPath.Child("memory"), errs)
	}
	if c := s.Sizes.Compute; c != nil {
		validateComputeSizes(c, sizesPath.Child("compute"), errs)
	}
}

// Memory is the sizes' memory rules, nil where none are given.
func (s *Sharing) Memory() *MemorySizes {
	if s == nil || s.Sizes == nil {
		return nil
	}
	return s.Sizes.Memory
}

func validateMemorySizes(m *MemorySizes, path *field.Path, errs *FieldErrors) {
	rule := SizeRule{Min: DefaultMemoryMin, Step: DefaultMemoryStep}
	ok := true
	for _, f := range []struct {
		name string
		q    Quantity
		to   *int64
	}{{"default", m.Default, &rule.Default}, {"min", m.Min, &rule.Min}, {"step", m.Step, &rule.Step}} {
		if f.q == "" {
			continue
		}
		v, err := resource.ParseQuantity(string(f.q))
		if err != nil {
			errs.Add(path.Child(f.name), "%q is not a quantity (such as 16Gi)", f.q)
			ok = false
			continue
		}
		n, exact := v.AsInt64()
		switch {
		case !exact:
			errs.Add(path.Child(f.name), "%s is not a whole number of bytes", f.q)
			ok = false
		case n <= 0:
			errs.Add(path.Child(f.name), "must be more than 0, not %s", f.q)
			ok = false
		default:
			*f.to = n
		}
	}
	if ok {
		checkRule(rule, m.Default != "", path, errs, formatBytes)
	}
}

func validateComputeSizes(c *ComputeSizes, path *field.Path, errs *FieldErrors) {
	rule := SizeRule{Min: DefaultComputeMin, Step: DefaultComputeStep}
	ok := true
	for _, f := range []struct {
		name string
		v    *int64
		to   *int64
	}{{"default", c.Default, &rule.Default}, {"min", c.Min, &rule.Min}, {"step", c.Step, &rule.Step}} {
		switch {
		case f.v == nil:
		case *f.v <= 0:
			errs.Add(path.Child(f.name), "must be more than 0, not %d", *f.v)
			ok = false
		case *f.v > MaxCompute:
			errs.Add(path.Child(f.name), "must be at most %d (per cent of the SMs), not %d", MaxCompute, *f.v)
			ok = false
		default:
			*f.to = *f.v
		}
	}
	if !ok {
		return
	}
	checkRule(rule, c.Default != nil, path, errs, formatPercent)
	// The API server refuses a policy whose first step passes the value.
	if rule.Min+rule.Step > MaxCompute {
		errs.Add(path.Child("step"), "min %d plus one step %d is more than %d: the API server refuses such a request policy", rule.Min, rule.Step, MaxCompute)
	}
}

// checkRule refuses a default below the minimum or off the step: the API
// server refuses a request policy whose default is not min + k·step, and
// the allocator would never consume it.
func checkRule(r SizeRule, hasDefault bool, path *field.Path, errs *FieldErrors, format func(int64) string) {
	if !hasDefault {
		return
	}
	switch {
	case r.Default < r.Min:
		errs.Add(path.Child("default"), "%s is below min %s", format(r.Default), format(r.Min))
	case !OnStep(r.Default, r.Min, r.Step):
		errs.Add(path.Child("default"), "%s is off the step: sizes are min %s plus a whole number of steps of %s", format(r.Default), format(r.Min), format(r.Step))
	}
}

// formatBytes writes a size as the API writes quantities (16Gi).
func formatBytes(n int64) string {
	return resource.NewQuantity(n, resource.BinarySI).String()
}

func formatPercent(n int64) string {
	return resource.NewQuantity(n, resource.DecimalSI).String() + " %"
}
