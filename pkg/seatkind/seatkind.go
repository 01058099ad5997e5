// Package seatkind is the seam between the DRA plugin's claim route and
// the ways the node holds a seat on its GPUs. A seat of a whole-GPU group
// is time-sliced with the group's other seats (package sharedseats,
// TimeSliced), or shares the group's GPUs through the group's MPS daemon
// (sharedseats, MPS); a MIG seat is a MIG instance of its own (package
// migseats). The route takes every claim through the same steps whatever
// its devices, and at each step asks every kind, in one order, to do its
// part for the devices of the claim that are its own; a kind leaves the
// others alone. Adding a kind adds an implementation, not a branch of the
// route.
//
// The life of one claim, as a kind sees it:
//
//  1. The seat ledger records the claim's seats. No kind is asked before:
//     whatever a kind makes belongs to recorded seats, so a crash leaves
//     nothing that no record names, and the next start can tell what to
//     undo.
//  2. Prepare readies the hardware for the claim's devices (a MIG
//     instance made, an MPS daemon answering with the claim's share, a
//     time slice set), at the claim's first prepare and at any later one
//     that writes its spec again. It finds what an earlier call made and
//     makes what is missing, so a crash between any two steps is repaired
//     by the kubelet's retry. A failure fails this claim only; its seats
//     stay recorded for the retry, or for its unprepare.
//  3. Edit gives each request of the claim's spec what a container needs
//     to use the request's devices of the kind (a MIG device's UUID and
//     capability nodes, the MPS client's pipe and share). It reads what
//     Prepare made and changes nothing: a spec is written again from the
//     ledger's entry alone, after a reboot emptied the CDI directory.
//  4. Verify, at a repeated prepare, tells which of the claim's devices
//     lost what Prepare made since (a MIG instance destroyed outside the
//     plugin): the claim's spec is then written again, after Prepare
//     makes them anew.
//  5. At unprepare, Release undoes what Prepare made for the claims
//     before their seats are freed: a claim whose Release fails keeps its
//     seats, and the kubelet's retry releases it.
//  6. Released follows the freeing of the seats: a kind lets go of what
//     no held claim needs any more (an MPS daemon stops, or lowers its
//     limits to the largest share still held).
//
// A kind is called concurrently for different claims; the ledger's claim
// locks keep the calls for one claim apart.
package seatkind

import (
	"context"
	"errors"

	"k8s.io/apimachinery/pkg/types"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
)

// Kind is one way the node holds seats. Its methods are the steps of a
// claim's life in the order the package comment gives them.
type Kind interface {
	// Prepare readies the hardware for entry's devices of this kind.
	Prepare(ctx context.Context, claim types.UID, entry *checkpoint.Claim) error
	// Edit adds to req's container edits what its devices of this kind
	// need.
	Edit(claim types.UID, req Request) error
	// Verify names the devices of entry whose hardware went since Prepare
	// made it; specExists says whether the claim's spec is on the node.
	Verify(ctx context.Context, claim types.UID, entry *checkpoint.Claim, specExists bool) (gone []string)
	// Release undoes what Prepare made for claims about to be released;
	// an error keeps that claim's seats.
	Release(ctx context.Context, claims []types.UID) map[types.UID]error
	// Released follows the release of claims.
	Released(ctx context.Context, claims []types.UID)
}

// Request is one request of a claim as its spec gives it to containers.
// Every device of the request carries the edits of the whole request: a
// container that takes the request sees all of its seats in one
// consistent environment, whichever device the runtime applies last.
type Request struct {
	Name string
	// Devices are the request's devices, and Seats what each gives a
	// container, in the same order.
	Devices []checkpoint.Device
	Seats   []containeredits.Seat
	// Options are the request's edit options, which a kind may extend.
	Options *containeredits.Options
}

// The kinds of failure a Kind reports, which the plugin counts apart
// (kyb_dra_errors_total{kind}). errors.Is tells them.
var (
	// ErrMIG: a MIG instance, or the MIG mode of a GPU.
	ErrMIG = errors.New("MIG")
	// ErrSharing: an MPS daemon or a time slice.
	ErrSharing = errors.New("sharing")
)

// Failed marks err as a failure of kind (ErrMIG, ErrSharing), keeping its
// message.
func Failed(kind, err error) error {
	if err == nil {
		return nil
	}
	return failure{kind: kind, err: err}
}

type failure struct{ kind, err error }

func (f failure) Error() string   { return f.err.Error() }
func (f failure) Unwrap() []error { return []error{f.err, f.kind} }
