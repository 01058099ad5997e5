package draplugin

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/klog/v2"

	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/driver"
)

// rebuild reconstructs the checkpoint after both copies were lost: from
// the claims allocated on this node's pool and the seats the plugin wrote
// into their status (status.devices[].data). A claim without that record
// was never completely prepared; the kubelet prepares it again. Generations
// restart above a floor taken from the clock, so no generation handed out
// before the loss repeats.
func (d *Driver) rebuild(ctx context.Context) (*checkpoint.State, []types.UID, error) {
	list, err := d.client.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, fmt.Errorf("list the ResourceClaims to rebuild the checkpoint from: %w", err)
	}
	st := checkpoint.New()
	st.GenerationFloor = d.clock.Now().Unix()
	var allocatedHere []types.UID
	for i := range list.Items {
		claim := &list.Items[i]
		if claim.Status.Allocation == nil {
			continue
		}
		if _, released := d.releasedWhileLost.Load(claim.UID); released {
			continue
		}
		recorded := map[string]SeatStatus{}
		for _, ds := range claim.Status.Devices {
			if ds.Driver != driver.Name || ds.Pool != d.pool || ds.Data == nil {
				continue
			}
			var s SeatStatus
			if json.Unmarshal(ds.Data.Raw, &s) == nil {
				recorded[ds.Device+"/"+deref(ds.ShareID)] = s
			}
		}
		entry := &checkpoint.Claim{Namespace: claim.Namespace, Name: claim.Name, Phase: checkpoint.PrepareCompleted}
		complete, ours := true, false
		for _, r := range claim.Status.Allocation.Devices.Results {
			if r.Driver != driver.Name || r.Pool != d.pool {
				continue
			}
			ours = true
			share := ""
			if r.ShareID != nil {
				share = string(*r.ShareID)
			}
			s, ok := recorded[r.Device+"/"+share]
			ref, known := d.index[r.Device]
			if !ok || !known {
				complete = false
				break
			}
			cfg, err := seatConfig(claim.Status.Allocation.Devices.Config, r)
			if err != nil {
				complete = false
				break
			}
			dev := checkpoint.Device{
				Requests: []string{resourceclaim.BaseRequestRef(r.Request)}, Pool: r.Pool, Device: r.Device, ShareID: share,
				GroupDevice: ref.Group.DeviceName(), Profile: s.Profile, Group: s.Group,
				GPUs: s.GPUs, GPUUUIDs: s.GPUUUIDs, Seats: s.Seats, Generations: s.Generations,
				CDIDevice: r.Device, VisibleDevices: string(cfg.VisibleDevices),
			}
			if share != "" {
				dev.CDIDevice += "-" + share
			}
			entry.Devices = append(entry.Devices, dev)
			for i, seat := range s.Seats {
				k := checkpoint.SeatKey(dev.GroupDevice, seat)
				st.Generations[k] = max(st.Generations[k], s.Generations[i], st.GenerationFloor)
			}
		}
		if ours {
			allocatedHere = append(allocatedHere, claim.UID)
		}
		if ours && complete {
			st.Claims[claim.UID] = entry
		}
	}
	slices.Sort(allocatedHere)
	return st, allocatedHere, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// recoverLostState runs in the background while the checkpoint is lost:
// it retries the rebuild until the API server answers, then makes the
// plugin whole again. Until then prepares of new claims are refused (their
// seats cannot be chosen safely), unprepares work.
func (d *Driver) recoverLostState(ctx context.Context) {
	logger := klog.FromContext(ctx)
	backoff := wait.Backoff{Duration: time.Second, Factor: 2, Cap: time.Minute, Steps: 1 << 30}
	_ = wait.ExponentialBackoffWithContext(ctx, backoff, func(ctx context.Context) (bool, error) {
		st, allocated, err := d.rebuild(ctx)
		if err != nil {
			logger.Error(err, "Rebuilding the lost checkpoint failed; retrying")
			return false, nil
		}
		unlock, err := d.lockState()
		if err != nil {
			logger.Error(err, "Rebuilding the lost checkpoint failed; retrying")
			return false, nil
		}
		defer unlock()
		if err := d.adopt(ctx, st, allocated); err != nil {
			logger.Error(err, "Rebuilding the lost checkpoint failed; retrying")
			return false, nil
		}
		d.lost.Store(false)
		logger.Info("Rebuilt the checkpoint from the API server", "claims", len(st.Claims))
		d.event("Normal", "CheckpointRebuilt", fmt.Sprintf("The plugin's checkpoint was lost; rebuilt %d prepared claims from the API server", len(st.Claims)))
		return true, nil
	})
}

// adopt makes a rebuilt state the node's state: it writes the specs of its
// claims, removes specs of claims no longer allocated here, and saves it.
// Call with d.mu and the file lock held.
func (d *Driver) adopt(ctx context.Context, st *checkpoint.State, allocated []types.UID) error {
	st.BootID = readBootID(d.opts.BootIDFile)
	for uid, c := range st.Claims {
		if err := d.writeSpec(uid, c); err != nil {
			klog.FromContext(ctx).Error(err, "Cannot write the CDI spec of a rebuilt claim", "claim", klog.KRef(c.Namespace, c.Name))
		}
	}
	specs, err := d.cdi.Claims()
	if err != nil {
		return err
	}
	for _, uid := range specs {
		if _, owned := st.Claims[uid]; owned || slices.Contains(allocated, uid) {
			continue
		}
		if err := d.cdi.Remove(uid); err != nil {
			return err
		}
	}
	if err := d.store.Quarantine(); err != nil {
		return err
	}
	return d.save(st)
}
