package seatledger

import (
	"context"
	"fmt"
	"maps"
	"reflect"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containerclaims"
)

// untrusted is a claim whose seats could not be recovered, and why.
type untrusted struct {
	uid             types.UID
	namespace, name string
	why             string
}

// rebuilt is a record rebuilt after a loss: the state, every claim
// allocated on this node (whose specs stay), and the claims fenced.
type rebuilt struct {
	st        *checkpoint.State
	allocated []types.UID
	untrusted []untrusted
}

// rebuild reconstructs the record after both copies of the checkpoint were
// lost, from every record the node has of each claim allocated on its pool
// (recover.go). Generations restart above a floor taken from the clock, so
// that no generation handed out before the loss repeats. It also returns
// every claim allocated here, recorded or not, whose specs must stay, and
// the claims it fenced.
func (rc *recoverer) rebuild(ctx context.Context) (*rebuilt, error) {
	list, err := rc.opts.Claims.ResourceClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("list the ResourceClaims to rebuild the checkpoint from: %w", err)
	}
	st := checkpoint.New()
	st.GenerationFloor = rc.opts.Clock.Now().Unix()
	var allocatedHere []types.UID
	var found []untrusted
	ours := map[types.UID]*resourceapi.ResourceClaim{}
	fence := func(claim *resourceapi.ResourceClaim, why string) {
		st.Claims[claim.UID].Devices = rc.fencedDevices(claim, rc.ourResults(claim))
		found = append(found, untrusted{claim.UID, claim.Namespace, claim.Name, why})
	}
	for i := range list.Items {
		claim := &list.Items[i]
		// A claim whose UID is not safe in a file name was never prepared:
		// its prepare is refused before any seat is recorded.
		if claim.Status.Allocation == nil || cdi.CheckClaimUID(claim.UID) != nil {
			continue
		}
		results := rc.ourResults(claim)
		if len(results) == 0 {
			continue
		}
		allocatedHere = append(allocatedHere, claim.UID)
		ours[claim.UID] = claim
		fromStatus, inStatus, statusErr := rc.fromStatus(claim, results)
		fromSpec, inSpec, specErr := rc.fromSpec(claim, results)
		if !inStatus && !inSpec {
			// Never given to a container: every container starts from its
			// claim's spec. The kubelet prepares it again.
			continue
		}
		st.Claims[claim.UID] = &checkpoint.Claim{Namespace: claim.Namespace, Name: claim.Name, Phase: checkpoint.PrepareCompleted, Standalone: containerclaims.Standalone(claim)}
		switch {
		case inSpec && specErr != nil:
			fence(claim, "its CDI spec cannot be read back: "+specErr.Error())
		case inStatus && statusErr != nil:
			fence(claim, "its status cannot be trusted: "+statusErr.Error())
		case inSpec && inStatus && !reflect.DeepEqual(fromSpec, fromStatus):
			fence(claim, "its status and its CDI spec give it different seats")
		case inSpec:
			st.Claims[claim.UID].Devices = fromSpec
		default:
			st.Claims[claim.UID].Devices = fromStatus
		}
	}
	// Two records of one seat: one of them lies, and either container may
	// use it. Both claims are fenced.
	holder := map[string]types.UID{}
	for _, uid := range slices.Sorted(maps.Keys(st.Claims)) {
		for _, dev := range st.Claims[uid].Devices {
			for _, seat := range dev.Seats {
				k := checkpoint.SeatKey(dev.GroupDevice, seat)
				other, twice := holder[k]
				if !twice {
					holder[k] = uid
					continue
				}
				why := fmt.Sprintf("seat %d of group %s is recorded for it and for claim %s/%s", seat, dev.Group, st.Claims[other].Namespace, st.Claims[other].Name)
				if !st.Claims[other].Fenced() {
					fence(ours[other], fmt.Sprintf("seat %d of group %s is recorded for it and for claim %s/%s", seat, dev.Group, st.Claims[uid].Namespace, st.Claims[uid].Name))
				}
				if !st.Claims[uid].Fenced() {
					fence(ours[uid], why)
				}
			}
		}
	}
	for _, c := range st.Claims {
		for _, dev := range c.Devices {
			for i, seat := range dev.Seats {
				k := checkpoint.SeatKey(dev.GroupDevice, seat)
				st.Generations[k] = max(st.Generations[k], dev.Generations[i], st.GenerationFloor)
			}
		}
	}
	slices.Sort(allocatedHere)
	return &rebuilt{st: st, allocated: allocatedHere, untrusted: found}, nil
}

// adopt makes a rebuilt record the node's: it drops the claims released
// while the checkpoint was lost, keeps the generations of what was left of
// the checkpoint (baseline, if not nil), writes the specs of the claims
// whose seats are known, removes specs of claims no longer allocated here,
// saves it, and reports the claims it fenced. It returns a summary for
// operators. Call with the lock held.
//
// The baseline gives no claim its seats: a claim it records that has no
// record elsewhere (no status, no spec) was given to no container, or was
// released by the save the baseline lacks.
func (p *repairer) adopt(ctx context.Context, rb *rebuilt, baseline *checkpoint.State) (string, error) {
	logger := klog.FromContext(ctx)
	st := rb.st
	for uid := range p.rec.releasedWhileLost {
		delete(st.Claims, uid)
	}
	if baseline != nil {
		st.GenerationFloor = max(st.GenerationFloor, baseline.GenerationFloor)
		for k, g := range baseline.Generations {
			st.Generations[k] = max(st.Generations[k], g)
		}
	}
	if err := st.Validate(); err != nil {
		return "", fmt.Errorf("the rebuilt checkpoint does not validate (a bug): %w", err)
	}
	st.BootID = p.opts.BootID
	fromSpecs := 0
	for uid, c := range st.Claims {
		if c.Fenced() {
			continue
		}
		hadSpec := p.opts.Specs.Exists(uid)
		if hadSpec {
			fromSpecs++
			// Containers may hold it beside another claim: the spec keeps
			// naming GPUs the way that allows.
			if env, ok, err := p.opts.Specs.ReadEnv(uid); err == nil && ok {
				if n, combined := containerclaims.CombinedInSpec(c, env); combined {
					c.Combined, c.CombinedGPUs = true, n
				}
			}
		}
		// With no spec to tell, a claim any pod may hold is combined.
		if c.Standalone && !hadSpec {
			c.Combined = true
		}
		if err := p.opts.Specs.Write(uid, c); err != nil {
			logger.Error(err, "Cannot write the CDI spec of a rebuilt claim", "claim", klog.KRef(c.Namespace, c.Name))
		}
	}
	p.removeOrphanSpecs(ctx, func(uid types.UID) bool {
		_, owned := st.Claims[uid]
		return owned || (slices.Contains(rb.allocated, uid) && !p.rec.releasedWhileLost[uid])
	})
	if err := p.rec.store.Quarantine(); err != nil {
		return "", err
	}
	if err := p.rec.save(ctx, st); err != nil {
		return "", err
	}
	clear(p.rec.releasedWhileLost)
	p.rec.baseline = nil
	fenced := 0
	for _, u := range rb.untrusted {
		if _, kept := st.Claims[u.uid]; !kept {
			continue
		}
		fenced++
		p.rec.countError("rebuild", "untrusted")
		logger.Error(nil, "The seats of a claim could not be recovered; its group is fenced until it is released", "claim", klog.KRef(u.namespace, u.name), "uid", u.uid, "why", u.why)
	}
	summary := fmt.Sprintf("rebuilt %d prepared claims from the API server and the CDI specs on the node (%d with a spec on disk); %d could not be trusted and are fenced", len(st.Claims), fromSpecs, fenced)
	logger.Info("Rebuilt the checkpoint", "claims", len(st.Claims), "withSpecs", fromSpecs, "fenced", fenced)
	return summary, nil
}
