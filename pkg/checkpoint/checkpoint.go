// Package checkpoint is the plugin's memory across restarts: which claim
// holds which seats, with which generations, and how far each prepare got.
// It is the source of truth for prepared claims; CDI specs are derived from
// it and re-created from it after a reboot empties the CDI directory.
//
// On disk it is one JSON file under the plugin's data directory, in the
// envelope of package durablefile:
//
//	{"version": "v1", "checksum": "sha256:<hex of data>",
//	 "sum": "sha256:<hex of version and data>", "data": {...}}
//
// Plugins before sum wrote only checksum, and only version v1; they ignore
// sum.
//
// Decoding verifies the content too: a file whose checksums match but
// whose content contradicts itself (a seat held twice, lists of different
// lengths, a negative seat) was written by a bug or by hand and is corrupt
// as well (Validate).
//
// Writes are atomic, and the previous good file is kept beside it as a
// fallback against corruption (durablefile.File). Sync makes a save
// durable against the node losing power, which callers do behind the
// save, off the path of the call that needed it (see the plugin's design
// notes).
//
// Compatibility rule: a plugin reads its own versions and every older one
// (converting on read), and writes the oldest version that holds the
// state, so that a rollback to an older plugin keeps working unless the
// state uses what only a newer plugin understands (fenced devices need
// v2, admin-access devices v3, sized seats v4); it refuses to overwrite a file of a newer
// version, so a rollback never silently drops state it cannot read.
package checkpoint

import (
	"slices"

	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
	"github.com/kyb-ai/kyb-dra-driver/pkg/durablefile"
)

// The versions of the format. A file is written in the oldest that holds
// its state: V2 where a device is fenced, V3 where one has admin access,
// V4 where one holds a sized seat.
const (
	V1 = "v1"
	V2 = "v2"
	// V3 holds devices allocated with admin access (no seats).
	V3 = "v3"
	// V4 holds sized seats: an older plugin would read them as equal
	// shares of their group and give their containers other limits.
	V4 = "v4"
	// Version is the newest format this plugin reads and writes.
	Version = V4
)

// FileName is the checkpoint's file name in the plugin data directory.
const FileName = "checkpoint.json"

// Phase is how far a claim's prepare got.
type Phase string

const (
	// PrepareStarted: seats are chosen and recorded, the CDI spec may not
	// be written yet and the kubelet has no answer. Earlier plugins wrote
	// it; a later prepare completes it with the same seats, an unprepare
	// releases them.
	PrepareStarted Phase = "PrepareStarted"
	// PrepareCompleted: the claim holds its seats and its CDI spec is owed:
	// written by the prepare that recorded it, or again by a repeated
	// prepare or the next start when it is missing.
	PrepareCompleted Phase = "PrepareCompleted"
)

// State is everything the checkpoint holds.
type State struct {
	// BootID is the boot the state was last written in; a change means the
	// node rebooted and the CDI directory (tmpfs) is empty.
	BootID string `json:"bootID,omitempty"`
	// Claims are the prepared (or being prepared) claims by UID.
	Claims map[types.UID]*Claim `json:"claims"`
	// Generations counts, per seat ("<device>/<seat>"), how often the seat
	// was handed out. It outlives the claims, so that the next holder of a
	// seat always sees a new generation.
	Generations map[string]int64 `json:"generations"`
	// GenerationFloor is set when the state was rebuilt after a loss: every
	// seat's next generation is above it, so that no generation handed out
	// before the loss can repeat.
	GenerationFloor int64 `json:"generationFloor,omitempty"`
}

// Claim is one prepared claim.
type Claim struct {
	Namespace string   `json:"namespace"`
	Name      string   `json:"name"`
	Phase     Phase    `json:"phase"`
	Devices   []Device `json:"devices"`
	// StatusWritten says the claim's status holds its seats. It is kept
	// with the next save after the write, so a restart may write a status
	// again, never miss one.
	StatusWritten bool `json:"statusWritten,omitempty"`
	// Combined says a container may hold this claim and another of this
	// driver's: its spec then names the container's GPUs in a way that
	// does not depend on which claim's spec the runtime applies last.
	Combined bool `json:"combined,omitempty"`
	// CombinedGPUs, for a combined claim, is how many GPUs its spec names
	// by index: the most GPUs a container holding it sees with the other
	// claims it holds. 0: every GPU of the node (the conservative form,
	// and what plugins before this field wrote; they ignore it and read
	// such an entry as that).
	CombinedGPUs int `json:"combinedGPUs,omitempty"`
	// Standalone says no pod owns the claim (it was not made from a
	// template for one pod): any pod may reference it, beside claims
	// prepared later.
	Standalone bool `json:"standalone,omitempty"`
}

// IndexedGPUs is how many GPUs a combined claim's spec names by index on
// a node of nodeGPUs GPUs.
func (c *Claim) IndexedGPUs(nodeGPUs int) int {
	if c.CombinedGPUs > 0 && c.CombinedGPUs < nodeGPUs {
		return c.CombinedGPUs
	}
	return nodeGPUs
}

// Device is one allocation result of a claim and the seats it holds.
type Device struct {
	// Requests are the claim's requests this device serves.
	Requests []string `json:"requests"`
	Pool     string   `json:"pool"`
	Device   string   `json:"device"`
	// ShareID is the allocation's share of a shared device.
	ShareID string `json:"shareID,omitempty"`
	// GroupDevice is the group's shared device name (such as g01-2x): the
	// space seats are counted in, whichever layout Device was published in.
	GroupDevice string `json:"groupDevice"`
	// SeatStatus is the group, its GPUs, and the seats the device holds
	// with their generations: what the claim's status says of the device.
	v1alpha1.SeatStatus `json:",inline"`
	// CDIDevice is the device's name in the claim's CDI spec.
	CDIDevice string `json:"cdiDevice"`
	// VisibleDevices is the claim's configured naming of GPUs (uuid, index).
	VisibleDevices string `json:"visibleDevices,omitempty"`
	// Fenced marks a device whose seats are not known: a claim recovered
	// without a trustworthy record of them. It has no Seats and holds
	// every seat of its group: none is handed out while it is held.
	Fenced bool `json:"fenced,omitempty"`
}

// Fenced reports whether any of the claim's devices is fenced.
func (c *Claim) Fenced() bool {
	return slices.ContainsFunc(c.Devices, func(d Device) bool { return d.Fenced })
}

// New returns an empty state.
func New() *State {
	return &State{Claims: map[types.UID]*Claim{}, Generations: map[string]int64{}}
}

// ErrCorrupt says a checkpoint file failed its checksum, did not parse or
// could not be read.
var ErrCorrupt = durablefile.ErrCorrupt

// ErrNewerVersion says a checkpoint was written by a newer plugin.
var ErrNewerVersion = durablefile.ErrNewerVersion
