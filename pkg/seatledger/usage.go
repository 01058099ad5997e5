package seatledger

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
	"github.com/kyb-ai/kyb-dra-driver/pkg/draresources"
	"github.com/kyb-ai/kyb-dra-driver/pkg/nodeevents"
	"github.com/kyb-ai/kyb-dra-driver/pkg/planner"
)

// Why GPUs are fenced: the value of the gpu.kyb.ai/fenced taint.
const (
	// FenceEarlierConfiguration: a held claim's group was defined on these
	// GPUs by an earlier configuration, which no longer does.
	FenceEarlierConfiguration = "earlier-configuration"
	// FenceSeatsUnknown: a claim whose seats could not be recovered holds
	// a group on these GPUs.
	FenceSeatsUnknown = "seats-unknown"
)

// Usage is what the held claims use, as the publisher needs it.
type Usage struct {
	// Held are the seats held per group device; a fenced device holds all
	// of its group's.
	Held draresources.Held
	// Fenced are GPUs that must not be handed out through any group until
	// the claims holding them are released, with why (Fence*).
	Fenced map[int]string
	// Largest is, per group device, the most seats one claim holds there
	// (all of them for a fenced device), sized seats left out: the share
	// an MPS daemon of the group must allow.
	Largest map[string]int
	// Sizes is, per group device, the most memory and, on its own, the
	// most compute one claim's sized seats hold there: the limits an MPS
	// daemon of a sized group must allow.
	Sizes map[string]v1alpha1.SeatSize
}

func (u Usage) clone() Usage {
	return Usage{Held: maps.Clone(u.Held), Fenced: maps.Clone(u.Fenced), Largest: maps.Clone(u.Largest), Sizes: maps.Clone(u.Sizes)}
}

func (u Usage) equal(o Usage) bool {
	return maps.Equal(u.Held, o.Held) && maps.Equal(u.Fenced, o.Fenced) && maps.Equal(u.Largest, o.Largest) && maps.Equal(u.Sizes, o.Sizes)
}

// InUse are the group devices a claim holds a seat of, sized or not,
// sorted.
func (u Usage) InUse() []string {
	names := slices.Concat(slices.Collect(maps.Keys(u.Largest)), slices.Collect(maps.Keys(u.Sizes)))
	slices.Sort(names)
	return slices.Compact(names)
}

// fence is why a held device fences its GPUs, and the note an operator
// reads about it.
type fence struct {
	reason string
	note   string
}

// usageOf computes what st's claims use. A device fences its GPUs when it
// holds a group that today's plan does not define on the same GPUs (the
// configuration changed under a held claim: exclusivity is judged by the
// GPUs recorded for the claim), or when its seats are not known.
func usageOf(plan *planner.Plan, st *checkpoint.State) (Usage, map[types.UID]fence) {
	u := Usage{Held: draresources.Held{}, Fenced: map[int]string{}, Largest: map[string]int{}, Sizes: map[string]v1alpha1.SeatSize{}}
	fences := map[types.UID]fence{}
	for _, uid := range slices.Sorted(maps.Keys(st.Claims)) {
		c := st.Claims[uid]
		own := map[string]int{}
		ownSize := map[string]v1alpha1.SeatSize{}
		// hold counts a device's seats: the seats held, and a claim's
		// share (its size, on a sized group).
		hold := func(dev checkpoint.Device) {
			u.Held[dev.GroupDevice] += max(len(dev.Seats), 1)
			if dev.Size != nil {
				ownSize[dev.GroupDevice] = ownSize[dev.GroupDevice].Add(*dev.Size)
				return
			}
			own[dev.GroupDevice] += max(len(dev.Seats), 1)
		}
		for _, dev := range c.Devices {
			if dev.AdminAccess {
				continue // no seat, no fence: monitoring keeps nobody off
			}
			today := groupToday(plan, dev.GroupDevice)
			switch {
			case dev.Fenced:
				seats := 1
				if today != nil {
					seats = today.Seats()
				}
				u.Held[dev.GroupDevice] += seats
				own[dev.GroupDevice] += seats
				fences[uid] = fence{FenceSeatsUnknown, fmt.Sprintf("the seats claim %s/%s (%s) holds on group %s (GPUs %s) could not be recovered after the plugin's checkpoint was lost; no seat of the group, and no group sharing its GPUs, is handed out until the claim is released (delete its pods)",
					c.Namespace, c.Name, uid, dev.Group, gpuList(dev.GPUs))}
			case earlierConfiguration(plan, dev):
				hold(dev)
				now := "no longer defines it"
				if today != nil {
					now = "defines it on GPUs " + gpuList(today.GPUs)
				}
				fences[uid] = fence{FenceEarlierConfiguration, fmt.Sprintf("claim %s/%s (%s) holds group %s on GPUs %s as an earlier configuration defined it; the configuration now %s. GPUs %s stay fenced (no group containing them is handed out) until the claim is released",
					c.Namespace, c.Name, uid, dev.Group, gpuList(dev.GPUs), now, gpuList(dev.GPUs))}
			default:
				hold(dev)
				continue
			}
			for _, x := range dev.GPUs {
				if _, set := u.Fenced[x]; !set {
					u.Fenced[x] = fences[uid].reason
				}
			}
		}
		for gd, n := range own {
			u.Largest[gd] = max(u.Largest[gd], n)
		}
		for gd, size := range ownSize {
			u.Sizes[gd] = u.Sizes[gd].Max(size)
		}
	}
	// A fenced device holds its whole group, whatever else does.
	for gd, n := range u.Held {
		if g := plan.GroupByDevice(gd); g != nil && n > g.Seats() {
			u.Held[gd] = g.Seats()
			u.Largest[gd] = min(u.Largest[gd], g.Seats())
		}
	}
	return u, fences
}

func gpuList(gpus []int) string {
	s := make([]string, len(gpus))
	for i, x := range gpus {
		s[i] = fmt.Sprint(x)
	}
	return strings.Join(s, ",")
}

// noteUsage tells UsageChanged what the claims use when it changed, and
// operators of every claim that newly fences GPUs. Call with r.mu held.
func (r *record) noteUsage(ctx context.Context, st *checkpoint.State) {
	u, fences := usageOf(r.opts.Plan, st)
	for uid, f := range fences {
		if _, known := r.told.fences[uid]; !known {
			r.opts.Events.Warning(ctx, nodeevents.ReasonGPUsFenced, f.note)
		}
	}
	r.told.fences = fences
	if r.told.known && u.equal(r.told.usage) {
		return
	}
	r.told.usage, r.told.known = u, true
	if r.opts.Feed != nil {
		r.opts.Feed.set(u.clone())
	}
	if r.opts.UsageChanged != nil {
		r.opts.UsageChanged(u.clone())
	}
}

// UsageFeed tells the parts that size the hardware by what the held
// claims use (the MPS daemons' limits) what they use now. It is made
// before the ledger, so that the parts the ledger itself needs (the claim
// specs, and the seat kinds they ask) can hold it; the ledger opened with
// it (Options.Feed) keeps it told. Until then, and while a lost
// checkpoint is not rebuilt, it knows nothing.
type UsageFeed struct {
	mu     sync.Mutex
	ledger *Ledger
	usage  Usage
	known  bool
}

// Last is what the ledger told last; known is false until it told.
func (f *UsageFeed) Last() (u Usage, known bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.usage.clone(), f.known
}

// Fresh is what the held claims use now: where another plugin instance
// shares the checkpoint (a rolling update), it is read again first
// (Ledger.Refresh), so that no decision acts on one instance's view
// alone. It fails while the checkpoint is lost.
func (f *UsageFeed) Fresh(ctx context.Context) (Usage, error) {
	f.mu.Lock()
	l := f.ledger
	f.mu.Unlock()
	if l != nil {
		if err := l.Refresh(ctx); err != nil {
			return Usage{}, err
		}
	}
	u, _ := f.Last()
	return u, nil
}

func (f *UsageFeed) set(u Usage) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.usage, f.known = u, true
}

func (f *UsageFeed) attach(l *Ledger) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ledger = l
}
