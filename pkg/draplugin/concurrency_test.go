package draplugin_test

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/kyb-ai/kyb-dra-driver/pkg/cdi"
	"github.com/kyb-ai/kyb-dra-driver/pkg/checkpoint"
)

// 200 claims prepared and unprepared at once over the real socket (run
// with -race): every call succeeds, no seat is held twice, and when the
// plugin stops no goroutine is left behind.
func TestTwoHundredConcurrentClaims(t *testing.T) {
	before := runtime.NumGoroutine()
	e := newEnv(t, "nvlink-2x4", "profiles: [{resource: kyb.ai/gpu-1x-seat, seatsPerGroup: 32}]\n")
	claims := make([]*resourceapi.ResourceClaim, 200)
	for i := range claims {
		claims[i] = e.claim(class1x)
	}
	run := func(op string) {
		var wg sync.WaitGroup
		errs := make(chan error, len(claims))
		for _, c := range claims {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var err error
				switch op {
				case "prepare":
					resp, callErr := e.dra.NodePrepareResources(e.ctx, prepareRequest(c))
					if err = callErr; err == nil && resp.Claims[string(c.UID)].Error != "" {
						err = fmt.Errorf("%s", resp.Claims[string(c.UID)].Error)
					}
				default:
					resp, callErr := e.dra.NodeUnprepareResources(e.ctx, unprepareRequest(c))
					if err = callErr; err == nil && resp.Claims[string(c.UID)].Error != "" {
						err = fmt.Errorf("%s", resp.Claims[string(c.UID)].Error)
					}
				}
				if err != nil {
					errs <- fmt.Errorf("%s %s: %w", op, c.Name, err)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	}
	run("prepare")
	st, _, err := checkpoint.NewStore(e.dirs.plugin).Load()
	if err != nil || len(st.Claims) != 200 {
		t.Fatalf("checkpoint holds %d claims (%v)", len(st.Claims), err)
	}
	seats := map[string]bool{}
	for _, c := range st.Claims {
		for _, d := range c.Devices {
			key := fmt.Sprintf("%s/%v", d.GroupDevice, d.Seats)
			if seats[key] {
				t.Errorf("seat %s held twice", key)
			}
			seats[key] = true
		}
	}
	run("unprepare")
	st, _, _ = checkpoint.NewStore(e.dirs.plugin).Load()
	specs, _ := filepath.Glob(filepath.Join(e.dirs.cdi, cdi.SpecName("")+"*"))
	if len(st.Claims) != 0 || len(specs) != 0 {
		t.Errorf("after unpreparing everything: %d claims, %d specs", len(st.Claims), len(specs))
	}

	e.stop()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before+10 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before+10 {
		buf := make([]byte, 1<<20)
		t.Errorf("%d goroutines after stop, %d before start:\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
}

// A CDI directory the plugin cannot write fails the claims it could not
// prepare, each with the reason, and nothing else.
func TestCDIDirectoryNotWritable(t *testing.T) {
	e := newEnv(t, "nvlink-2x4", seed)
	good := e.claim(class1x)
	e.prepareOK(good)
	bad := e.claim(class1x)
	// A directory where the spec file must go: the rename into place fails,
	// as it does on a read-only or full file system.
	if err := os.Mkdir(filepath.Join(e.dirs.cdi, cdi.SpecName(bad.UID)+".json"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := e.prepare(bad)[string(bad.UID)]
	if !strings.Contains(r.Error, "write CDI spec for claim "+string(bad.UID)) {
		t.Errorf("error %q does not say what failed", r.Error)
	}
	if again := e.prepare(good)[string(good.UID)]; again.Error != "" {
		t.Errorf("the other claim was affected: %s", again.Error)
	}
}
