// Package driverapi asks the CUDA driver what a process sees: it loads
// libcuda.so.1 the way CUDA applications do (dlopen, so that a missing
// driver is a finding, not a failure to start), initialises it, and lists
// every device with its name, UUID and memory, allocating a little on each
// to prove the device can be used. kyb-cuda-probe prints the result; the
// doctor runs it in a sandbox built from a seat's CDI spec.
package driverapi

/*
#cgo LDFLAGS: -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

typedef int (*cu_init_t)(unsigned int);
typedef int (*cu_int_t)(int *);
typedef int (*cu_device_get_t)(int *, int);
typedef int (*cu_device_get_name_t)(char *, int, int);
typedef int (*cu_device_get_uuid_t)(unsigned char *, int);
typedef int (*cu_device_total_mem_t)(size_t *, int);
typedef int (*cu_ctx_retain_t)(void **, int);
typedef int (*cu_ctx_release_t)(int);
typedef int (*cu_ctx_set_t)(void *);
typedef int (*cu_mem_alloc_t)(unsigned long long *, size_t);
typedef int (*cu_mem_free_t)(unsigned long long);
typedef int (*cu_mem_get_info_t)(size_t *, size_t *);

static void *lib;

static const char *probe_open(void) {
	lib = dlopen("libcuda.so.1", RTLD_NOW);
	return lib ? NULL : dlerror();
}

// probe_path is the file the loader found libcuda.so.1 in.
static const char *probe_path(void) {
	void *sym = dlsym(lib, "cuInit");
	Dl_info info;
	if (sym == NULL || dladdr(sym, &info) == 0) {
		return "";
	}
	return info.dli_fname;
}

static void *sym(const char *name) { return dlsym(lib, name); }

static int call_init(void *f) { return ((cu_init_t)f)(0); }
static int call_int(void *f, int *out) { return ((cu_int_t)f)(out); }
static int call_device_get(void *f, int *dev, int ordinal) { return ((cu_device_get_t)f)(dev, ordinal); }
static int call_name(void *f, char *buf, int len, int dev) { return ((cu_device_get_name_t)f)(buf, len, dev); }
static int call_uuid(void *f, unsigned char *buf, int dev) { return ((cu_device_get_uuid_t)f)(buf, dev); }
static int call_total_mem(void *f, size_t *out, int dev) { return ((cu_device_total_mem_t)f)(out, dev); }

// alloc retains the device's primary context, allocates bytes on it and
// frees them again; with keep, the context and the allocation stay until
// the process exits.
static int call_alloc(void *retain, void *set, void *alloc, void *release, void *free_, int dev, size_t bytes, int keep, int *stage) {
	void *ctx = NULL;
	int ret;
	*stage = 0;
	if ((ret = ((cu_ctx_retain_t)retain)(&ctx, dev)) != 0) return ret;
	*stage = 1;
	if ((ret = ((cu_ctx_set_t)set)(ctx)) != 0) { ((cu_ctx_release_t)release)(dev); return ret; }
	*stage = 2;
	unsigned long long ptr = 0;
	if ((ret = ((cu_mem_alloc_t)alloc)(&ptr, bytes)) != 0) { ((cu_ctx_release_t)release)(dev); return ret; }
	*stage = 3;
	if (keep) return 0;
	ret = ((cu_mem_free_t)free_)(ptr);
	((cu_ctx_release_t)release)(dev);
	return ret;
}

// try_alloc retains the device's primary context, reads what it may still
// allocate (get_info, where the library has it), and allocates each of
// sizes in turn, freeing each allocation that succeeds before the next:
// rets[i] is cuMemAlloc's answer for sizes[i]. It returns the context's
// own errors (stage 0: retain, 1: set current).
static int call_try(void *retain, void *set, void *alloc, void *release, void *free_, void *get_info, int dev,
		unsigned long long *sizes, int n, int *rets, size_t *free_bytes, int *stage) {
	void *ctx = NULL;
	int ret;
	*stage = 0;
	if ((ret = ((cu_ctx_retain_t)retain)(&ctx, dev)) != 0) return ret;
	*stage = 1;
	if ((ret = ((cu_ctx_set_t)set)(ctx)) != 0) { ((cu_ctx_release_t)release)(dev); return ret; }
	size_t total = 0;
	*free_bytes = 0;
	if (get_info != NULL && ((cu_mem_get_info_t)get_info)(free_bytes, &total) != 0) *free_bytes = 0;
	for (int i = 0; i < n; i++) {
		unsigned long long ptr = 0;
		rets[i] = ((cu_mem_alloc_t)alloc)(&ptr, (size_t)sizes[i]);
		if (rets[i] == 0) ((cu_mem_free_t)free_)(ptr);
	}
	((cu_ctx_release_t)release)(dev);
	return 0;
}
*/
import "C"

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"unsafe"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cudaprobe"
)

// allocBytes is what the probe allocates on each device: enough to need a
// context and memory, little enough to fit beside any workload.
const allocBytes = 1 << 20

// envPrefixes select the environment the result reports.
var envPrefixes = []string{"CUDA_", "NVIDIA_", "KYB_", "LD_LIBRARY_PATH"}

// Options say what the probe does beside listing the devices.
type Options struct {
	// Hold keeps each device's primary context retained and its
	// allocation held until the process exits: a process that holds a
	// CUDA context on its GPUs, as NVML then lists it.
	Hold bool
	// TryAlloc are sizes in bytes to allocate on each device, one after
	// the other, each freed before the next: what a seat's limit grants
	// and refuses.
	TryAlloc []uint64
}

// Run probes the CUDA driver of this process's environment.
func Run() cudaprobe.Result { return Probe(Options{}) }

// Hold is Run, except that each device's primary context stays retained
// and its allocation held until the process exits.
func Hold() cudaprobe.Result { return Probe(Options{Hold: true}) }

// Probe probes the CUDA driver of this process's environment as opts say.
func Probe(opts Options) cudaprobe.Result {
	r := cudaprobe.Result{Env: map[string]string{}, Devices: []cudaprobe.Device{}}
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		for _, p := range envPrefixes {
			if strings.HasPrefix(k, p) {
				r.Env[k] = v
			}
		}
	}
	nodes, _ := filepath.Glob("/dev/nvidia*")
	r.DeviceNodes = append([]string{}, nodes...)
	slices.Sort(r.DeviceNodes)

	if msg := C.probe_open(); msg != nil {
		r.Error = "dlopen libcuda.so.1: " + C.GoString(msg)
		return r
	}
	r.Library = C.GoString(C.probe_path())
	syms := map[string]unsafe.Pointer{}
	for _, name := range []string{"cuInit", "cuDriverGetVersion", "cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetName", "cuDeviceGetUuid",
		"cuDeviceTotalMem_v2", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent", "cuMemAlloc_v2", "cuDevicePrimaryCtxRelease_v2", "cuMemFree_v2"} {
		cname := C.CString(name)
		p := C.sym(cname)
		C.free(unsafe.Pointer(cname))
		if p == nil {
			r.Error = "libcuda.so.1 lacks " + name
			return r
		}
		syms[name] = p
	}
	if ret := C.call_init(syms["cuInit"]); ret != 0 {
		r.Error = fmt.Sprintf("cuInit: CUDA error %d", int(ret))
		return r
	}
	var version, count C.int
	if ret := C.call_int(syms["cuDriverGetVersion"], &version); ret == 0 {
		r.DriverVersion = int(version)
	}
	if ret := C.call_int(syms["cuDeviceGetCount"], &count); ret != 0 {
		r.Error = fmt.Sprintf("cuDeviceGetCount: CUDA error %d", int(ret))
		return r
	}
	for i := range int(count) {
		d := probeDevice(syms, i, opts.Hold)
		if len(opts.TryAlloc) > 0 && d.MemAlloc == "ok" {
			tryAlloc(syms, &d, opts.TryAlloc)
		}
		r.Devices = append(r.Devices, d)
	}
	return r
}

// cudaErrors name the CUDA errors an allocation meets.
var cudaErrors = map[int]string{2: "out of memory", 201: "invalid context", 805: "MPS connection failed", 807: "MPS server not ready"}

func cudaError(call string, ret int) string {
	if name, ok := cudaErrors[ret]; ok {
		return fmt.Sprintf("%s: CUDA error %d (%s)", call, ret, name)
	}
	return fmt.Sprintf("%s: CUDA error %d", call, ret)
}

// tryAlloc tries each size on the device d names, in its primary context.
func tryAlloc(syms map[string]unsafe.Pointer, d *cudaprobe.Device, sizes []uint64) {
	var dev C.int
	if ret := C.call_device_get(syms["cuDeviceGet"], &dev, C.int(d.Ordinal)); ret != 0 {
		return
	}
	csizes := make([]C.ulonglong, len(sizes))
	for i, n := range sizes {
		csizes[i] = C.ulonglong(n)
	}
	rets := make([]C.int, len(sizes))
	// Optional: the probe lists devices without it.
	cname := C.CString("cuMemGetInfo_v2")
	getInfo := C.sym(cname)
	C.free(unsafe.Pointer(cname))
	var free C.size_t
	var stage C.int
	ret := C.call_try(syms["cuDevicePrimaryCtxRetain"], syms["cuCtxSetCurrent"], syms["cuMemAlloc_v2"], syms["cuDevicePrimaryCtxRelease_v2"], syms["cuMemFree_v2"], getInfo,
		dev, &csizes[0], C.int(len(sizes)), &rets[0], &free, &stage)
	d.FreeBytes = uint64(free)
	for i, n := range sizes {
		t := cudaprobe.Try{Bytes: n, Result: "ok"}
		switch {
		case ret != 0:
			t.Result = cudaError([]string{"cuDevicePrimaryCtxRetain", "cuCtxSetCurrent"}[int(stage)], int(ret))
		case rets[i] != 0:
			t.Result = cudaError("cuMemAlloc", int(rets[i]))
		}
		d.Tries = append(d.Tries, t)
	}
}

func probeDevice(syms map[string]unsafe.Pointer, ordinal int, keep bool) cudaprobe.Device {
	d := cudaprobe.Device{Ordinal: ordinal}
	var dev C.int
	if ret := C.call_device_get(syms["cuDeviceGet"], &dev, C.int(ordinal)); ret != 0 {
		d.MemAlloc = fmt.Sprintf("cuDeviceGet: CUDA error %d", int(ret))
		return d
	}
	name := make([]byte, 256)
	if C.call_name(syms["cuDeviceGetName"], (*C.char)(unsafe.Pointer(&name[0])), C.int(len(name)), dev) == 0 {
		d.Name = strings.TrimRight(string(name), "\x00")
	}
	uuid := make([]byte, 16)
	if C.call_uuid(syms["cuDeviceGetUuid"], (*C.uchar)(unsafe.Pointer(&uuid[0])), dev) == 0 {
		d.UUID = formatUUID(uuid)
	}
	var mem C.size_t
	if C.call_total_mem(syms["cuDeviceTotalMem_v2"], &mem, dev) == 0 {
		d.MemoryBytes = uint64(mem)
	}
	var stage, keepIt C.int
	if keep {
		keepIt = 1
	}
	ret := C.call_alloc(syms["cuDevicePrimaryCtxRetain"], syms["cuCtxSetCurrent"], syms["cuMemAlloc_v2"], syms["cuDevicePrimaryCtxRelease_v2"], syms["cuMemFree_v2"], dev, allocBytes, keepIt, &stage)
	d.MemAlloc = "ok"
	if ret != 0 {
		steps := []string{"cuDevicePrimaryCtxRetain", "cuCtxSetCurrent", "cuMemAlloc", "cuMemFree"}
		d.MemAlloc = fmt.Sprintf("%s: CUDA error %d", steps[int(stage)], int(ret))
	}
	return d
}

// formatUUID renders CUDA's 16 bytes as NVML does: GPU-8-4-4-4-12.
func formatUUID(b []byte) string {
	h := fmt.Sprintf("%x", b)
	return "GPU-" + h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}
