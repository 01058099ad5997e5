// Package containerclaims decides which of this driver's claims one
// container holds together, and how the specs of such claims name their
// GPUs: the rule, the kubelet's and the API server's answers it reads
// (Finder), and the marks it leaves on the seat ledger's entries
// (Combine), in one place.
//
// A container that holds two of this driver's claims gets the spec of
// each, and the runtime keeps the environment of the last one it applies:
// each claim's own UUIDs would hide the other's GPUs. Such claims are
// combined: their specs name GPUs by index, CUDA_VISIBLE_DEVICES=0..n-1
// in PCI order, which is right whichever spec comes last, because the
// device nodes decide what CUDA can open and it stops at the first index
// past them. n is the most GPUs any container holding the claim sees with
// its other claims: a spec is shared by every container that uses the
// request, and software that counts the entries must not count more GPUs
// than it has.
//
// Which containers hold which claims is in the pods' specs, not in the
// prepare call; the plugin asks the kubelet's PodResources API (Finder).
// It names claims whole, so a container that references a claim with
// several requests counts as holding them all, and such a claim is
// combined; except an extended-resource claim, whose requests are each
// one container's (see requestGroups). A held claim that a container of a
// later pod holds beside a new one, or beside another held claim, is
// combined from then on, and its spec is written again before that pod's
// prepare answers (Combine's widened claims). A combined claim
// stays combined, and its n only grows: a spec a container already read
// is never narrowed under it. So a claim of the call that fails adds no
// GPU to its partners' n: the kubelet marks a pod's claims prepared only
// once the whole call succeeded, and calls again with all of them before
// any container starts; that call counts them.
//
// Where the kubelet could not say (Holders lacks the claim), the rule is
// the conservative one that needs no pod: the kubelet prepares a pod's
// claims for a driver in one call, leaving out only those it prepared
// before for another pod, and only a standalone claim can be one of
// those. So a claim is combined, over every GPU of the node, when its call
// holds several claims, when it is standalone, or when its pod references
// a standalone claim the node holds (Holders.Beside; that one is combined
// too); and, over its own GPUs, when one container may hold several of
// its requests.
package containerclaims

import (
	"k8s.io/apimachinery/pkg/types"
)

// Holders are the containers that hold the claims of a prepare call.
type Holders struct {
	// Containers are, for each claim of the call whose holders the
	// kubelet named, the containers of the pods reserving it that
	// reference it, each as every claim it references (any driver's).
	Containers map[types.UID][][]types.NamespacedName
	// Pods are every container of the pods the kubelet named them for,
	// each as every claim it references: a container holding none of the
	// call's claims may hold two held claims, which no call of their own
	// will combine (the kubelet prepares them no more).
	Pods [][]types.NamespacedName
	// Beside marks claims of the call, decided conservatively, whose pod
	// also references a standalone claim the node holds: BesideHeld.
	Beside     map[types.UID]bool
	BesideHeld []types.NamespacedName
}
