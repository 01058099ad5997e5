package simnode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"
)

// FaultsFileFormat documents the fault-injection file, for flag help and
// docs/health.md. Faults go through the simulated NVML event sets and
// device calls, so the plugin's real health code handles them.
const FaultsFileFormat = `one command per line; blank lines and lines starting with # are skipped:
  xid GPU XID [GI [CI]]  an XID error event on GPU (index), such as "xid 0 79"; with GI (and CI), on that MIG GPU instance (and compute instance), such as "xid 0 31 3"
  ecc GPU [GI [CI]]      a double-bit ECC error event, of the whole GPU or of a MIG instance
  lost GPU               the GPU falls off the bus: NVML calls on it answer ERROR_GPU_IS_LOST and a GPU-unavailable event is sent
  recover GPU            NVML calls on the GPU answer again (a lost GPU stays unhealthy in the plugin until it restarts)
  action GPU ACTION      the driver asks for a recovery action: NVML's GPU recovery-action field answers ACTION (none, gpu-reset, node-reboot, drain-p2p, drain-and-reset) and a recovery-action event is sent
Only lines appended while the plugin runs are applied, each once; lines already in the file when it starts are skipped, so a restarted plugin does not replay old faults.`

// Fault is one command of the fault-injection file.
type Fault struct {
	// Op is xid, ecc, lost or recover.
	Op  string
	GPU int
	// XID is the XID of an xid command.
	XID uint64
	// Instance is the MIG instance of an xid or ecc command; nil: the
	// whole GPU.
	Instance *EventInstance
	// Action is the recovery action of an action command.
	Action nvml.DeviceGpuRecoveryAction
}

// ParseFault parses one line of the fault-injection file.
func ParseFault(line string) (Fault, error) {
	fields := strings.Fields(line)
	if len(fields) == 0 {
		return Fault{}, errors.New("empty command")
	}
	f := Fault{Op: fields[0]}
	args := 1
	if f.Op == "xid" || f.Op == "action" {
		args = 2
	}
	// xid and ecc may name a MIG instance after their arguments.
	optional := 0
	switch f.Op {
	case "xid", "ecc":
		optional = 2
	case "lost", "recover", "action":
	default:
		return Fault{}, fmt.Errorf("unknown command %q: want xid, ecc, lost, recover or action", f.Op)
	}
	if len(fields) < 1+args || len(fields) > 1+args+optional {
		if optional == 0 {
			return Fault{}, fmt.Errorf("%s takes %d argument(s), got %d", f.Op, args, len(fields)-1)
		}
		return Fault{}, fmt.Errorf("%s takes %d argument(s) and at most %d more (GI, CI), got %d", f.Op, args, optional, len(fields)-1)
	}
	gpu, err := strconv.Atoi(fields[1])
	if err != nil || gpu < 0 {
		return Fault{}, fmt.Errorf("GPU %q is not an index", fields[1])
	}
	f.GPU = gpu
	if f.Op == "xid" {
		if f.XID, err = strconv.ParseUint(fields[2], 10, 64); err != nil || f.XID == 0 {
			return Fault{}, fmt.Errorf("XID %q is not a positive number", fields[2])
		}
	}
	if f.Op == "action" {
		if f.Action, err = ParseRecoveryAction(fields[2]); err != nil {
			return Fault{}, err
		}
	}
	if ids := fields[1+args:]; len(ids) > 0 {
		f.Instance = &EventInstance{GPUInstance: NoInstanceID, ComputeInstance: NoInstanceID}
		for i, name := range []string{"GI", "CI"}[:len(ids)] {
			id, err := strconv.ParseUint(ids[i], 10, 32)
			if err != nil || id >= NoInstanceID {
				return Fault{}, fmt.Errorf("%s %q is not an instance ID", name, ids[i])
			}
			if i == 0 {
				f.Instance.GPUInstance = uint32(id)
			} else {
				f.Instance.ComputeInstance = uint32(id)
			}
		}
	}
	return f, nil
}

// Apply makes a fault happen on the node.
func (n *Node) Apply(f Fault) error {
	switch f.Op {
	case "xid":
		return n.Inject(Event{GPU: f.GPU, Type: nvml.EventTypeXidCriticalError, Data: f.XID, Instance: f.Instance})
	case "ecc":
		return n.Inject(Event{GPU: f.GPU, Type: nvml.EventTypeDoubleBitEccError, Instance: f.Instance})
	case "lost":
		if err := n.SetLost(f.GPU, true); err != nil {
			return err
		}
		return n.Inject(Event{GPU: f.GPU, Type: nvml.EventTypeGpuUnavailableError})
	case "recover":
		return n.SetLost(f.GPU, false)
	case "action":
		if err := n.SetRecoveryAction(f.GPU, f.Action); err != nil {
			return err
		}
		return n.Inject(Event{GPU: f.GPU, Type: nvml.EventTypeGpuRecoveryAction, Data: uint64(f.Action)})
	}
	return fmt.Errorf("unknown fault %q", f.Op)
}

// WatchFaults applies the commands appended to the file at path (see
// FaultsFileFormat), polling it every interval until ctx ends. The file
// need not exist yet; one that is truncated or replaced is read again from
// its start.
func (n *Node) WatchFaults(ctx context.Context, path string, interval time.Duration) {
	logger := klog.LoggerWithValues(klog.FromContext(ctx), "faultsFile", path)
	w := &faultsFile{path: path}
	w.skipExisting()
	logger.Info("Watching the fault-injection file", "skippedBytes", w.offset)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		lines, err := w.poll()
		if err != nil {
			logger.Error(err, "Cannot read the fault-injection file")
		}
		for _, l := range lines {
			w.lineNo++
			l = strings.TrimSpace(l)
			if l == "" || strings.HasPrefix(l, "#") {
				continue
			}
			f, err := ParseFault(l)
			if err == nil {
				err = n.Apply(f)
			}
			if err != nil {
				logger.Error(err, "Skipping a line of the fault-injection file", "line", w.lineNo, "text", l)
				continue
			}
			logger.Info("Injected a simulated fault", "line", w.lineNo, "op", f.Op, "gpu", f.GPU, "xid", f.XID, "instance", f.Instance)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// faultsFile reads the lines appended to a file since the last poll.
type faultsFile struct {
	path    string
	info    os.FileInfo
	offset  int64
	partial string
	lineNo  int
}

func (w *faultsFile) skipExisting() {
	if st, err := os.Stat(w.path); err == nil {
		w.info, w.offset = st, st.Size()
	}
}

// poll returns the complete lines appended since the last call; a line
// without its newline yet waits for the next poll.
func (w *faultsFile) poll() ([]string, error) {
	st, err := os.Stat(w.path)
	if errors.Is(err, os.ErrNotExist) {
		w.info, w.offset, w.partial = nil, 0, ""
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if w.info != nil && (!os.SameFile(w.info, st) || st.Size() < w.offset) {
		// Replaced or truncated: the new content is new commands.
		w.offset, w.partial = 0, ""
	}
	w.info = st
	if st.Size() == w.offset {
		return nil, nil
	}
	f, err := os.Open(w.path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.NewSectionReader(f, w.offset, st.Size()-w.offset))
	if err != nil {
		return nil, err
	}
	w.offset += int64(len(data))
	text := w.partial + string(data)
	lines := strings.Split(text, "\n")
	w.partial = lines[len(lines)-1]
	return lines[:len(lines)-1], nil
}
