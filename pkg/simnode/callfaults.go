package simnode

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Beside the faults a GPU suffers (fault events, a lost GPU), a test can
// make a single NVML call fail: the Nth call of CreateComputeInstance, or
// the Nth MIG call of any kind, answers the code it is given. That is how
// a test stops a sequence of NVML calls between any two of them, as a
// crash or a driver error would, and checks what the sequence left behind.
// A failed call changes nothing, as NVML promises for a call that returns
// an error; what the calls before it made stays made.

// Call names an NVML call that FailCall can make fail.
type Call string

// The calls FailCall can make fail: the MIG calls of a device, of its GPU
// and compute instances, and of its MIG device handles.
const (
	// CallAnyMIG counts every call below, whatever it is.
	CallAnyMIG                             Call = "any MIG call"
	CallGetMigMode                         Call = "GetMigMode"
	CallSetMigMode                         Call = "SetMigMode"
	CallGetGpuInstanceProfileInfo          Call = "GetGpuInstanceProfileInfo"
	CallGetGpuInstancePossiblePlacements   Call = "GetGpuInstancePossiblePlacements"
	CallCreateGpuInstance                  Call = "CreateGpuInstance"
	CallCreateGpuInstanceWithPlacement     Call = "CreateGpuInstanceWithPlacement"
	CallGetGpuInstances                    Call = "GetGpuInstances"
	CallGetGpuInstanceByID                 Call = "GetGpuInstanceById"
	CallGetMaxMigDeviceCount               Call = "GetMaxMigDeviceCount"
	CallGetMigDeviceHandleByIndex          Call = "GetMigDeviceHandleByIndex"
	CallIsMigDeviceHandle                  Call = "IsMigDeviceHandle"
	CallGetDeviceHandleFromMigDeviceHandle Call = "GetDeviceHandleFromMigDeviceHandle"
	CallGpuInstanceGetInfo                 Call = "GpuInstance.GetInfo"
	CallGetComputeInstanceProfileInfo      Call = "GpuInstance.GetComputeInstanceProfileInfo"
	CallCreateComputeInstance              Call = "GpuInstance.CreateComputeInstance"
	CallGetComputeInstances                Call = "GpuInstance.GetComputeInstances"
	CallGetComputeInstanceByID             Call = "GpuInstance.GetComputeInstanceById"
	CallGpuInstanceDestroy                 Call = "GpuInstance.Destroy"
	CallComputeInstanceGetInfo             Call = "ComputeInstance.GetInfo"
	CallComputeInstanceDestroy             Call = "ComputeInstance.Destroy"
	CallMigDeviceGetUUID                   Call = "MigDevice.GetUUID"
)

// MIGCalls lists the MIG calls FailCall can make fail, CallAnyMIG aside.
func MIGCalls() []Call {
	return []Call{
		CallGetMigMode, CallSetMigMode, CallGetGpuInstanceProfileInfo, CallGetGpuInstancePossiblePlacements,
		CallCreateGpuInstance, CallCreateGpuInstanceWithPlacement, CallGetGpuInstances, CallGetGpuInstanceByID,
		CallGetMaxMigDeviceCount, CallGetMigDeviceHandleByIndex, CallIsMigDeviceHandle, CallGetDeviceHandleFromMigDeviceHandle,
		CallGpuInstanceGetInfo, CallGetComputeInstanceProfileInfo, CallCreateComputeInstance, CallGetComputeInstances,
		CallGetComputeInstanceByID, CallGpuInstanceDestroy, CallComputeInstanceGetInfo, CallComputeInstanceDestroy,
		CallMigDeviceGetUUID,
	}
}

// CallFault makes one NVML call fail.
type CallFault struct {
	Call Call
	// Nth counts from when the fault is set: 1 fails the next call of
	// Call, 2 the one after, and so on. Calls on every GPU of the node
	// count.
	Nth int
	// Ret is what the call answers, such as nvml.ERROR_UNKNOWN.
	Ret nvml.Return
}

// FailCall sets a fault; several may wait at once, each fires once.
func (n *Node) FailCall(f CallFault) error {
	if f.Call != CallAnyMIG && !slices.Contains(MIGCalls(), f.Call) {
		names := []string{string(CallAnyMIG)}
		for _, c := range MIGCalls() {
			names = append(names, string(c))
		}
		return fmt.Errorf("cannot fail NVML call %q: calls are %s", f.Call, strings.Join(names, ", "))
	}
	if f.Nth < 1 {
		return fmt.Errorf("fail call %s: Nth is %d, want 1 or more", f.Call, f.Nth)
	}
	if f.Ret == nvml.SUCCESS {
		return fmt.Errorf("fail call %s: the answer is SUCCESS, want an error", f.Call)
	}
	n.calls.mu.Lock()
	defer n.calls.mu.Unlock()
	n.calls.armed = append(n.calls.armed, armedFault{CallFault: f, at: n.calls.counts[f.Call] + f.Nth})
	return nil
}

// CallCount is how many calls of c the node has answered (CallAnyMIG:
// of every MIG call), failed ones included.
func (n *Node) CallCount(c Call) int {
	n.calls.mu.Lock()
	defer n.calls.mu.Unlock()
	return n.calls.counts[c]
}

// callFaults counts calls and holds the faults waiting for theirs.
type callFaults struct {
	mu     sync.Mutex
	counts map[Call]int
	armed  []armedFault
}

type armedFault struct {
	CallFault
	// at is the count of Call at which the fault fires.
	at int
}

// answer counts a call and says whether a fault makes it fail
// (nvml.SUCCESS: it does not).
func (c *callFaults) answer(call Call) nvml.Return {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.counts == nil {
		c.counts = map[Call]int{}
	}
	c.counts[call]++
	c.counts[CallAnyMIG]++
	for i, f := range c.armed {
		if f.at == c.counts[f.Call] && (f.Call == call || f.Call == CallAnyMIG) {
			c.armed = slices.Delete(c.armed, i, i+1)
			return f.Ret
		}
	}
	return nvml.SUCCESS
}
