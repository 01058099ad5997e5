package deviceplugin

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
	"github.com/kyb-ai/kyb-dra-driver/pkg/containeredits"
	"github.com/kyb-ai/kyb-dra-driver/pkg/health"
	"github.com/kyb-ai/kyb-dra-driver/pkg/inventory"
)

// Allocate gives each container request its seats' environment and
// devices, computed as the DRA plugin computes them (containeredits.Build),
// so a container sees the same thing whichever surface served it.
//
// The request carries no pod identity, and needs none: the seat IDs name
// group and seat, which is all the edits depend on. The one piece of state
// is the seat generation (KYB_SEAT_GEN). The kubelet never says when a seat
// is released, so the shim counts hand-outs instead: every Allocate of a
// seat increments its counter, in memory. A restarted shim counts from 1
// again, and the kubelet calling Allocate again for a running pod (after it
// lost its own checkpoint) counts as a hand-out.
//
// Every ID is checked before any generation moves: a request naming an
// unknown seat fails whole, with InvalidArgument naming the ID.
func (r *resource) Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	perContainer := make([][]seatRef, len(req.ContainerRequests))
	for i, creq := range req.ContainerRequests {
		refs, err := r.lookup(creq.DevicesIds)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "container request %d: %v", i, err)
		}
		perContainer[i] = refs
	}
	resp := &pluginapi.AllocateResponse{ContainerResponses: make([]*pluginapi.ContainerAllocateResponse, len(perContainer))}
	for i, refs := range perContainer {
		cresp, err := r.allocateContainer(ctx, refs)
		if err != nil {
			r.logger.Error(err, "Cannot allocate", "seats", r.idsOf(refs))
			return nil, status.Errorf(codes.Internal, "container request %d (%s): %v", i, strings.Join(r.idsOf(refs), ","), err)
		}
		resp.ContainerResponses[i] = cresp
	}
	return resp, nil
}

// lookup resolves a container's seat IDs, dropping duplicates, in seat
// order.
func (r *resource) lookup(ids []string) ([]seatRef, error) {
	if len(ids) == 0 {
		return nil, fmt.Errorf("no devices of %s requested", r.name)
	}
	refs := make([]seatRef, 0, len(ids))
	for _, id := range ids {
		ref, ok := r.seats[id]
		if !ok {
			return nil, fmt.Errorf("unknown device %q: %s has no such seat on this node (its seats are named like %s)", id, r.name, r.ids[0])
		}
		if !slices.Contains(refs, ref) {
			refs = append(refs, ref)
		}
	}
	slices.SortFunc(refs, func(a, b seatRef) int { return a.idx - b.idx })
	return refs, nil
}

// allocateContainer hands out the seats of one container request. The
// seats' groups are readied first (time slice, MPS daemon), so that a
// group that cannot share as its profile says fails the request before a
// generation moves.
func (r *resource) allocateContainer(ctx context.Context, refs []seatRef) (*pluginapi.ContainerAllocateResponse, error) {
	if r.mig != nil {
		edits, gens, err := r.allocateMIG(ctx, refs)
		if err != nil {
			return nil, err
		}
		var gpus []inventory.GPU
		for _, ref := range refs {
			if g, ok := r.delivery.inv.GPUByIndex(r.mig.seats[ref.idx].GPU.Index()); ok && !slices.ContainsFunc(gpus, func(x inventory.GPU) bool { return x.Index == g.Index }) {
				gpus = append(gpus, *g)
			}
		}
		return r.respond(refs, gens, edits, gpus)
	}
	bad := r.health.Faults()
	var seats []containeredits.Seat
	var gpus []inventory.GPU
	var byGroup [][]seatRef
	for _, ref := range refs {
		g := r.groups[ref.group]
		if ok, why := health.OfGPUs(g.GPUs, bad); !ok {
			// The kubelet allocates only healthy devices; a GPU that failed
			// since then still fails the container more clearly than a
			// refusal that leaves the pod in UnexpectedAdmissionError.
			r.logger.Info("Allocating a seat of an unhealthy group", "seat", r.ids[ref.idx], "group", g.Name, "health", why)
		}
		if len(seats) == 0 || seats[len(seats)-1].Group != g.Name {
			s := containeredits.Seat{Group: g.Name}
			for _, x := range g.GPUs {
				gpu, ok := r.delivery.inv.GPUByIndex(x)
				if !ok {
					return nil, fmt.Errorf("GPU %d of group %s is not in the inventory", x, g.Name)
				}
				s.GPUs = append(s.GPUs, *gpu)
				gpus = append(gpus, *gpu)
			}
			seats = append(seats, s)
			byGroup = append(byGroup, nil)
		}
		byGroup[len(byGroup)-1] = append(byGroup[len(byGroup)-1], ref)
	}
	opts := r.delivery.edits
	for _, group := range byGroup {
		client, err := r.delivery.sharing.prepare(ctx, r.groups[group[0].group], r.idsOf(group), len(byGroup))
		if err != nil {
			return nil, err
		}
		if client != nil {
			opts.MPS = client
		}
	}
	var gens []int64
	for i, group := range byGroup {
		for _, ref := range group {
			gen := r.gens[ref.idx].Add(1)
			gens = append(gens, gen)
			seats[i].Seats = append(seats[i].Seats, ref.seat)
			seats[i].Generations = append(seats[i].Generations, gen)
		}
	}
	edits, err := containeredits.Build(seats, opts)
	if err != nil {
		return nil, err
	}
	return r.respond(refs, gens, edits, gpus)
}

// respond answers a container request with its edits, as the injection
// says.
func (r *resource) respond(refs []seatRef, gens []int64, edits *containeredits.Edits, gpus []inventory.GPU) (*pluginapi.ContainerAllocateResponse, error) {
	ids := r.idsOf(refs)
	if r.delivery.injection == InjectionCDI {
		cresp, err := r.cdiResponse(refs[0], gens[0], edits, gpus)
		if err != nil {
			return nil, err
		}
		r.logger.V(2).Info("Allocated", "seats", ids, "generations", gens, "cdiDevices", cresp.CdiDevices)
		return cresp, nil
	}
	r.logger.V(2).Info("Allocated", "seats", ids, "generations", gens)
	return envResponse(edits), nil
}

// envResponse returns the edits as the kubelet applies them itself:
// environment, device nodes and bind mounts. Device nodes are always sent,
// even where the NVIDIA runtime would add them from NVIDIA_VISIBLE_DEVICES:
// nodes in the OCI spec survive a `systemctl daemon-reload`, nodes added by
// the runtime hook do not.
func envResponse(e *containeredits.Edits) *pluginapi.ContainerAllocateResponse {
	cresp := &pluginapi.ContainerAllocateResponse{Envs: make(map[string]string, len(e.Env))}
	for _, kv := range e.Env {
		k, v, _ := strings.Cut(kv, "=")
		cresp.Envs[k] = v
	}
	for _, d := range e.DeviceNodes {
		cresp.Devices = append(cresp.Devices, &pluginapi.DeviceSpec{ContainerPath: d.Path, HostPath: d.HostPath, Permissions: "rw"})
	}
	for _, m := range e.Mounts {
		cresp.Mounts = append(cresp.Mounts, &pluginapi.Mount{ContainerPath: m.ContainerPath, HostPath: m.HostPath, ReadOnly: !m.Writable})
	}
	return cresp
}

// cdiResponse writes the edits as a CDI spec and names its device.
//
// The spec is named after the request's first seat (kyb.ai-gpu_dp-<seat>),
// so handing that seat out again replaces it: the kubelet re-allocates a
// seat only after the pod holding it is gone, and until then the spec stays
// for the runtime to resolve on container restarts. The files are thus at
// most one per seat, with no clean-up to forget. The device name carries
// the seat's generation, so no CDI name is reused for different edits.
func (r *resource) cdiResponse(first seatRef, gen int64, edits *containeredits.Edits, gpus []inventory.GPU) (*pluginapi.ContainerAllocateResponse, error) {
	uid := types.UID("dp-" + r.ids[first.idx])
	name := "gen-" + strconv.FormatInt(gen, 10)
	if err := r.delivery.cdi.Write(uid, []cdi.Device{{Name: name, Edits: edits}}); err != nil {
		return nil, err
	}
	var nvidia []string
	if r.delivery.nvidiaCDI != nil {
		for _, g := range gpus {
			if id := r.delivery.nvidiaCDI(g.Index, g.UUID); id != "" {
				nvidia = append(nvidia, id)
			}
		}
	}
	cresp := &pluginapi.ContainerAllocateResponse{}
	for _, id := range cdi.InjectionOrder(cdi.DeviceID(uid, name), nvidia) {
		cresp.CdiDevices = append(cresp.CdiDevices, &pluginapi.CDIDevice{Name: id})
	}
	return cresp, nil
}

func (r *resource) idsOf(refs []seatRef) []string {
	out := make([]string, len(refs))
	for i, ref := range refs {
		out[i] = r.ids[ref.idx]
	}
	return out
}
