package seatledger

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
)

// rebuild reconstructs the record after both copies of the checkpoint were
// lost: from the claims allocated on this node's pool and the seats the
// plugin wrote into their status (status.devices[].data). A claim without
// that record was never completely prepared; the kubelet prepares it
// again. Generations restart above a floor taken from the clock, so no
// generation handed out before the loss repeats. It also returns every
// claim allocated here, recorded or not, whose specs must stay.
func (l *Ledger) rebuild(ctx context.Context) (*checkpoint.State, []types.UID, error) {
	list, err := l.opts.Claims.ResourceClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("list the ResourceClaims to rebuild the checkpoint from: %w", err)
	}
	st := checkpoint.New()
	st.GenerationFloor = l.opts.Clock.Now().Unix()
	var allocatedHere []types.UID
	for i := range list.Items {
		claim := &list.Items[i]
		if claim.Status.Allocation == nil {
			continue
		}
		entry, ours, complete := rebuildClaim(claim, l.opts.Pool, l.index)
		if ours {
			allocatedHere = append(allocatedHere, claim.UID)
		}
		if !ours || !complete {
			continue
		}
		st.Claims[claim.UID] = entry
		for _, dev := range entry.Devices {
			for i, seat := range dev.Seats {
				k := checkpoint.SeatKey(dev.GroupDevice, seat)
				st.Generations[k] = max(st.Generations[k], dev.Generations[i], st.GenerationFloor)
			}
		}
	}
	slices.Sort(allocatedHere)
	return st, allocatedHere, nil
}

// rebuildClaim is the entry of one claim from its allocation and status:
// ours says it is allocated on pool, complete that every device's seats
// are recorded in its status.
func rebuildClaim(claim *resourceapi.ResourceClaim, pool string, index map[string]draresources.DeviceRef) (entry *checkpoint.Claim, ours, complete bool) {
	recorded := map[string]v1alpha1.SeatStatus{}
	for _, ds := range claim.Status.Devices {
		if ds.Driver != driver.Name || ds.Pool != pool || ds.Data == nil {
			continue
		}
		var s v1alpha1.SeatStatus
		if json.Unmarshal(ds.Data.Raw, &s) == nil {
			recorded[ds.Device+"/"+deref(ds.ShareID)] = s
		}
	}
	entry = &checkpoint.Claim{Namespace: claim.Namespace, Name: claim.Name, Phase: checkpoint.PrepareCompleted}
	complete = true
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != driver.Name || r.Pool != pool {
			continue
		}
		ours = true
		share := ""
		if r.ShareID != nil {
			share = string(*r.ShareID)
		}
		s, ok := recorded[r.Device+"/"+share]
		ref, known := index[r.Device]
		if !ok || !known {
			complete = false
			break
		}
		cfg, err := seatConfig(claim.Status.Allocation.Devices.Config, r)
		if err != nil {
			complete = false
			break
		}
		entry.Devices = append(entry.Devices, newDevice(r, ref.Group, cfg, s))
	}
	return entry, ours, complete
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// adopt makes a rebuilt state the node's record: it drops the claims
// released while the checkpoint was lost, writes the specs of its claims,
// removes specs of claims no longer allocated here, and saves it. Call
// with the lock held.
func (l *Ledger) adopt(ctx context.Context, st *checkpoint.State, allocated []types.UID) error {
	for uid := range l.releasedWhileLost {
		delete(st.Claims, uid)
	}
	st.BootID = readBootID(l.opts.BootIDFile)
	for uid, c := range st.Claims {
		if err := l.opts.Specs.Write(uid, c); err != nil {
			klog.FromContext(ctx).Error(err, "Cannot write the CDI spec of a rebuilt claim", "claim", klog.KRef(c.Namespace, c.Name))
		}
	}
	l.removeOrphanSpecs(ctx, func(uid types.UID) bool {
		_, owned := st.Claims[uid]
		return owned || (slices.Contains(allocated, uid) && !l.releasedWhileLost[uid])
	})
	if err := l.store.Quarantine(); err != nil {
		return err
	}
	if err := l.save(st); err != nil {
		return err
	}
	clear(l.releasedWhileLost)
	klog.FromContext(ctx).Info("Rebuilt the checkpoint from the API server", "claims", len(st.Claims))
	return nil
}
