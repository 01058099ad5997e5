// Package podusage is the per-pod GPU metrics of the DRA plugin: what each
// container holding a seat uses of its GPUs, which dcgm-exporter cannot
// attribute for a driver other than NVIDIA's, and beside it the size its
// sized seats hold there. It samples the GPUs'
// processes and gives each to the seat its container holds, reading the
// held claims from the seat ledger (Ledger) and everything else from the
// node itself: the process's cgroup, the container runtime's CRI API, the
// container's mounts and the kubelet's PodResources API.
package podusage

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/cri"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/gpuusage"
	"github.com/kyb-ai/kyb-dra-driver/pkg/podresources"
)

// Options configure the per-pod GPU metrics.
type Options struct {
	// Sampler reads the GPUs' processes and their containers; nil: no
	// per-pod metrics.
	Sampler *gpuusage.Sampler
	// Interval is the time between samples (default 10s).
	Interval time.Duration
	// Containers names a container's pod and the container (the
	// container runtime's CRI API); nil: no process is given to a seat.
	Containers ContainerFinder
	// Mounts reads a process's mounts, which name the requests of the
	// claims its container uses (device metadata on); nil, or a claim
	// without such a mount: the claim comes whole from the PodResources
	// API.
	Mounts MountReader
}

// Ledger is what the metrics read of the seat ledger: the claims whose
// prepare completed (seatledger.Ledger). Entries' devices never change
// once recorded, so they are read without a lock.
type Ledger interface {
	Prepared() []*checkpoint.Claim
}

// ContainerFinder names the pod and the container of a runtime container
// ID (cri.Client).
type ContainerFinder interface {
	Container(ctx context.Context, id string) (cri.Container, error)
}

// MountReader reads a process's /proc/PID/mountinfo (gpuusage.ProcMounts).
type MountReader interface {
	Mountinfo(pid uint32) (string, error)
}

// seatAdmin is the seat label of a container whose claim has admin
// access: it sees the group's GPUs and holds no seat.
const seatAdmin = "admin"

// seatFenced is the seat label of a claim whose seats are not known.
const seatFenced = "fenced"

// Why a process's use is not a seat's (the reason label of
// kyb_gpu_unattributed_memory_used_bytes).
const (
	// outsidePods: the process is in no pod's container (the MPS daemon,
	// a host process), or its cgroup could not be read.
	outsidePods = "outside-pods"
	// noSeatHere: the process is a pod's, and the pod holds no seat of
	// this node's driver on that GPU (another driver's device, a GPU it
	// reached around its seat, or a pod the API does not know).
	noSeatHere = "no-seat-here"
)

// retryAfter is the longest a container that could not be named waits
// before it is looked for again. A container starts before its runtime
// or the kubelet may answer for it, so a new one is looked for again at
// the next samples; the wait then grows with the time it has been
// missing, so that a process in a container that never resolves (one the
// kubelet did not create) costs one lookup a minute, not one per sample.
const retryAfter = time.Minute

// missing is a container that could not be named: since when, and when it
// was last looked for.
type missing struct{ since, tried time.Time }

func (m missing) due(now time.Time, interval time.Duration) bool {
	wait := min(max(m.tried.Sub(m.since), interval), retryAfter)
	return now.Sub(m.tried) >= wait
}

// containerKey is one container's use of one GPU through one group, or
// of one MIG device (its UUID and placement; empty for a whole GPU's).
type containerKey struct {
	namespace, pod, container, group, seat string
	gpu                                    int
	migUUID, placement                     string
}

type containerUse struct {
	memory    uint64
	sm        float64
	processes int
	// size is what the container's sized seats hold on the GPU: their
	// memory on each GPU of the group and their share of its SMs, added
	// up as their MPS limits are; zero for other seats.
	size v1alpha1.SeatSize
}

type unattributedKey struct {
	gpu    int
	reason string
}

// usageSnapshot is one sample, attributed.
type usageSnapshot struct {
	gpus         []gpuusage.Usage
	containers   map[containerKey]*containerUse
	unattributed map[unattributedKey]uint64
}

// Usage samples the GPUs and attributes each process to the seat its
// container holds: process → cgroup → pod UID and container ID → the
// runtime's pod and container names (only when a container is new) → the
// requests its metadata mounts name, or else the claims the kubelet's
// PodResources API lists for it → the seats the ledger records for them
// on the process's GPU. Every source is the node's own.
type Usage struct {
	opts   Options
	ledger Ledger
	claims podresources.ClaimsReader
	// index finds a MIG seat's instance: a process in a MIG device is its
	// seat's only where the seat is at the device's placement.
	index map[string]draresources.DeviceRef
	// dataDevice is the major:minor of the plugin's data directory, where
	// the metadata files containers mount are ("": not known, and no
	// mount counts).
	dataDevice string

	// containers, missed and refused belong to the sampling goroutine.
	containers map[gpuusage.Container]*containerInfo
	missed     map[gpuusage.Container]missing
	// refused are the containers whose refused mounts were logged, by ID.
	refused map[string]bool

	mu   sync.Mutex
	last usageSnapshot
	errs map[string]string
}

// New makes the metrics of a node whose devices index names, whose
// plugin keeps its data (and the device metadata files containers mount)
// in dataDir. claims may be nil: no kubelet to ask.
func New(ctx context.Context, opts Options, ledger Ledger, claims podresources.ClaimsReader, dataDir string, index map[string]draresources.DeviceRef) *Usage {
	if opts.Interval <= 0 {
		opts.Interval = 10 * time.Second
	}
	u := &Usage{opts: opts, ledger: ledger, claims: claims, index: index,
		containers: map[gpuusage.Container]*containerInfo{}, missed: map[gpuusage.Container]missing{}, refused: map[string]bool{}, errs: map[string]string{}}
	if opts.Mounts != nil {
		dev, err := gpuusage.DeviceOf(dataDir)
		if err != nil {
			klog.FromContext(ctx).Error(err, "Cannot tell the device metadata files containers mount from others; the GPU metrics take each container's claims whole")
		}
		u.dataDevice = dev
	}
	return u
}

// Run samples until ctx ends.
func (u *Usage) Run(ctx context.Context) {
	ticker := time.NewTicker(u.opts.Interval)
	defer ticker.Stop()
	for {
		u.sample(ctx)
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

func (u *Usage) sample(ctx context.Context) {
	gpus := u.opts.Sampler.Sample()
	for _, g := range gpus {
		u.noteError(ctx, fmt.Sprintf("gpu %d", g.GPU.Index), g.Err)
	}
	u.noteError(ctx, "processes", u.opts.Sampler.SourceErr())
	u.noteError(ctx, "containers", u.resolveContainers(ctx, gpus))
	snap := u.attribute(gpus)
	u.mu.Lock()
	u.last = snap
	u.mu.Unlock()
}

// noteError logs an error when it first appears and when it goes, not at
// every sample.
func (u *Usage) noteError(ctx context.Context, what string, err error) {
	logger := klog.FromContext(ctx)
	u.mu.Lock()
	defer u.mu.Unlock()
	prev, had := u.errs[what]
	switch {
	case err != nil && (!had || prev != err.Error()):
		logger.Error(err, "Cannot read GPU usage", "part", what)
		u.errs[what] = err.Error()
	case err == nil && had:
		logger.Info("GPU usage readable again", "part", what)
		delete(u.errs, what)
	}
}

// resolveContainers names the containers that run on a GPU and were not
// named before, and forgets those that no longer do. It returns the first
// error of this sample.
func (u *Usage) resolveContainers(ctx context.Context, gpus []gpuusage.Usage) error {
	now := time.Now()
	// The processes of each container: their mounts are the container's,
	// as long as one of them still runs.
	running := map[gpuusage.Container][]uint32{}
	for _, g := range gpus {
		for _, p := range g.Processes {
			if p.InPod && !slices.Contains(running[p.Container], p.PID) {
				running[p.Container] = append(running[p.Container], p.PID)
			}
		}
	}
	var first error
	var answers podAnswers
	for _, c := range slices.SortedFunc(maps.Keys(running), func(a, b gpuusage.Container) int { return strings.Compare(a.ID, b.ID) }) {
		if _, ok := u.containers[c]; ok {
			continue
		}
		m, ok := u.missed[c]
		if ok && !m.due(now, u.opts.Interval) {
			continue
		}
		info, err := u.resolve(ctx, c, running[c], &answers)
		if err == nil {
			u.containers[c] = info
			delete(u.missed, c)
			continue
		}
		if errors.Is(err, errNoBudget) || podresources.RateLimited(err) {
			// Asked about at a later sample; no container is missing.
			continue
		}
		if first == nil {
			first = err
		}
		// A failed lookup backs off as a missing container does: a node
		// without the runtime's socket must not ask at every sample.
		if !ok {
			m.since = now
		}
		m.tried = now
		u.missed[c] = m
	}
	for c := range u.containers {
		if _, ok := running[c]; !ok {
			delete(u.containers, c)
		}
	}
	for c := range u.missed {
		if _, ok := running[c]; !ok {
			delete(u.missed, c)
		}
	}
	ids := map[string]bool{}
	for c := range running {
		ids[c.ID] = true
	}
	for id := range u.refused {
		if !ids[id] {
			delete(u.refused, id)
		}
	}
	return first
}

// attribute gives each process's use to the seat its container holds on
// the process's GPU.
func (u *Usage) attribute(gpus []gpuusage.Usage) usageSnapshot {
	held := map[types.NamespacedName]*checkpoint.Claim{}
	for _, c := range u.ledger.Prepared() {
		held[types.NamespacedName{Namespace: c.Namespace, Name: c.Name}] = c
	}
	snap := usageSnapshot{gpus: gpus, containers: map[containerKey]*containerUse{}, unattributed: map[unattributedKey]uint64{}}
	for _, g := range gpus {
		for _, p := range g.Processes {
			key, size, ok := u.seatOf(p, g.GPU.Index, held)
			if !ok {
				reason := noSeatHere
				if !p.InPod {
					reason = outsidePods
				}
				snap.unattributed[unattributedKey{g.GPU.Index, reason}] += p.MemoryBytes
				continue
			}
			use := snap.containers[key]
			if use == nil {
				use = &containerUse{size: size}
				snap.containers[key] = use
			}
			use.memory += p.MemoryBytes
			use.sm += p.SMPercent
			use.processes++
		}
	}
	return snap
}

// seatOf is the container, group and seats a process's use goes to, and
// the size the container's sized seats hold there.
func (u *Usage) seatOf(p gpuusage.Process, gpu int, held map[types.NamespacedName]*checkpoint.Claim) (containerKey, v1alpha1.SeatSize, bool) {
	var size v1alpha1.SeatSize
	if !p.InPod {
		return containerKey{}, size, false
	}
	info, ok := u.containers[p.Container]
	if !ok {
		return containerKey{}, size, false
	}
	group, seats, admin := "", map[int]bool{}, false
	for _, use := range info.uses {
		c := held[use.claim]
		if c == nil {
			continue
		}
		for _, dev := range c.Devices {
			if !slices.Contains(dev.GPUs, gpu) || (group != "" && dev.Group != group) || !use.uses(dev) || !u.inDevice(p, gpu, dev) {
				continue
			}
			group = dev.Group
			admin = admin || dev.AdminAccess
			for _, s := range dev.Seats {
				seats[s] = true
			}
			if dev.Size != nil {
				size = size.Add(*dev.Size)
			}
		}
	}
	if group == "" {
		return containerKey{}, size, false
	}
	key := containerKey{namespace: info.namespace, pod: info.pod, container: info.name, group: group, seat: seatLabel(seats, admin), gpu: gpu}
	if p.Instance != nil {
		key.migUUID, key.placement = p.Instance.UUID, p.Instance.Placement.String()
	}
	// Several sized seats of a group add up, at most all of the SMs, as
	// the container's MPS limits do.
	size.ComputePercent = min(size.ComputePercent, v1alpha1.MaxCompute)
	return key, size, true
}

// inDevice reports whether a process can be a claim device's: one in a
// MIG device is a MIG seat's at that device's placement, one on a whole
// GPU is no MIG seat's.
func (u *Usage) inDevice(p gpuusage.Process, gpu int, dev checkpoint.Device) bool {
	ref, ok := u.index[dev.Device]
	isMIG := ok && ref.MIG != nil
	if p.Instance == nil {
		return !isMIG
	}
	return isMIG && ref.MIG.GPU.Index() == gpu && ref.MIG.Placement == p.Instance.Placement
}

// seatLabel names a container's seats in a group: "0", "1,2", "admin"
// for admin access, or "fenced" for a claim whose seats were lost with
// the checkpoint (it holds the whole group).
func seatLabel(seats map[int]bool, admin bool) string {
	switch {
	case len(seats) == 0 && admin:
		return seatAdmin
	case len(seats) == 0:
		return seatFenced
	}
	var parts []string
	for _, s := range slices.Sorted(maps.Keys(seats)) {
		parts = append(parts, strconv.Itoa(s))
	}
	return strings.Join(parts, ",")
}

func (u *Usage) snapshot() usageSnapshot {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.last
}
