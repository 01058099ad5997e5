package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	v1alpha1 "github.com/kyb-ai/kyb-dra-driver/api/kyb.ai/v1alpha1"
)

func sample() *State {
	st := New()
	st.BootID = "boot-1"
	st.Claims["uid-1"] = &Claim{Namespace: "default", Name: "train", Phase: PrepareCompleted, Devices: []Device{{
		Requests: []string{"gpu"}, Pool: "node-1", Device: "g01-2x", ShareID: "share-1", GroupDevice: "g01-2x",
		SeatStatus: v1alpha1.SeatStatus{
			Profile: "2x", Group: "G01", GPUs: []int{0, 1}, GPUUUIDs: []string{"GPU-a", "GPU-b"},
			Seats: []int{0}, Generations: []int64{3},
		},
		CDIDevice: "g01-2x-share-1", VisibleDevices: "uuid",
	}}}
	st.Generations["g01-2x/0"] = 3
	return st
}

// A device is written with the same fields, in the same order, as every
// earlier version wrote them: files on nodes decode and verify unchanged.
func TestDeviceEncodingIsStable(t *testing.T) {
	got, err := json.Marshal(sample().Claims["uid-1"].Devices[0])
	if err != nil {
		t.Fatal(err)
	}
	want := `{"requests":["gpu"],"pool":"node-1","device":"g01-2x","shareID":"share-1","groupDevice":"g01-2x",` +
		`"profile":"2x","group":"G01","gpus":[0,1],"gpuUUIDs":["GPU-a","GPU-b"],"seats":[0],"generations":[3],` +
		`"cdiDevice":"g01-2x-share-1","visibleDevices":"uuid"}`
	if string(got) != want {
		t.Errorf("device encodes as\n%s\nwant\n%s", got, want)
	}
}

func TestRoundTrip(t *testing.T) {
	s := NewStore(t.TempDir())
	st, res, err := s.Load()
	if err != nil || !res.Fresh || len(st.Claims) != 0 {
		t.Fatalf("first load: %+v %+v %v", st, res, err)
	}
	if err := s.Save(sample()); err != nil {
		t.Fatal(err)
	}
	got, res, err := s.Load()
	if err != nil || res.Fresh || res.RecoveredFrom != nil {
		t.Fatalf("load: %+v %v", res, err)
	}
	if !reflect.DeepEqual(got, sample()) {
		t.Errorf("round trip:\n got %+v\nwant %+v", got, sample())
	}
	if fi, _ := os.Stat(s.Path()); fi.Mode().Perm() != 0o600 {
		t.Errorf("checkpoint mode %v, want 0600", fi.Mode().Perm())
	}
}

func TestCorruptionIsDetectedAndThePreviousCopyUsed(t *testing.T) {
	s := NewStore(t.TempDir())
	first := sample()
	if err := s.Save(first); err != nil {
		t.Fatal(err)
	}
	second := sample()
	second.Claims["uid-2"] = &Claim{Namespace: "default", Name: "other", Phase: PrepareStarted}
	if err := s.Save(second); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(s.Path())
	for name, corrupt := range map[string][]byte{
		"flipped byte": bytes.Replace(raw, []byte(`"G01"`), []byte(`"G02"`), 1),
		"truncated":    raw[:len(raw)/2],
		"empty":        nil,
	} {
		t.Run(name, func(t *testing.T) {
			if err := os.WriteFile(s.Path(), corrupt, 0o600); err != nil {
				t.Fatal(err)
			}
			got, res, err := s.Load()
			if err != nil {
				t.Fatal(err)
			}
			if res.RecoveredFrom == nil || !errors.Is(res.RecoveredFrom, ErrCorrupt) {
				t.Errorf("recovery not reported: %+v", res)
			}
			if !reflect.DeepEqual(got, first) {
				t.Errorf("recovered state is not the previous copy")
			}
		})
	}
	if err := os.WriteFile(s.prevPath(), []byte("{}"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Load(); !errors.Is(err, ErrCorrupt) {
		t.Errorf("both copies bad: %v, want ErrCorrupt", err)
	}
}

func TestCrashBetweenTheRenamesLeavesAUsableFile(t *testing.T) {
	s := NewStore(t.TempDir())
	if err := s.Save(sample()); err != nil {
		t.Fatal(err)
	}
	if err := s.Save(sample()); err != nil {
		t.Fatal(err)
	}
	// The instant between the two renames of a save: only the previous
	// copy exists.
	os.Remove(s.Path())
	got, res, err := s.Load()
	if err != nil || res.RecoveredFrom == nil || !reflect.DeepEqual(got, sample()) {
		t.Errorf("load with only the previous copy: %+v %v", res, err)
	}
}

func TestNewerVersionIsRefusedAndNotOverwritten(t *testing.T) {
	s := NewStore(t.TempDir())
	data := `{"claims":{}}`
	newer := `{"version":"v9","checksum":"` + checksum([]byte(data)) + `","sum":"` + sum("v9", []byte(data)) + `","data":` + data + `}`
	if err := os.WriteFile(s.Path(), []byte(newer), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Load(); !errors.Is(err, ErrNewerVersion) {
		t.Errorf("load of v9: %v", err)
	}
	if err := s.Save(New()); !errors.Is(err, ErrNewerVersion) {
		t.Errorf("save over v9: %v", err)
	}
	if raw, _ := os.ReadFile(s.Path()); string(raw) != newer {
		t.Error("a newer checkpoint was overwritten")
	}
}

// A previous copy a newer plugin wrote is not fallen back on: this plugin
// cannot judge it, and its next save would drop it.
func TestNewerPreviousCopyIsRefused(t *testing.T) {
	s := NewStore(t.TempDir())
	data := `{"claims":{}}`
	newer := `{"version":"v9","checksum":"` + checksum([]byte(data)) + `","sum":"` + sum("v9", []byte(data)) + `","data":` + data + `}`
	if err := os.WriteFile(s.prevPath(), []byte(newer), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.Path(), []byte("{torn"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Load(); !errors.Is(err, ErrNewerVersion) {
		t.Errorf("load with a damaged file and a v9 previous copy: %v, want ErrNewerVersion", err)
	}
}

// A checkpoint that is there but cannot be read is unusable, as a damaged
// one is: the previous copy is used, and with none the state is recovered
// (ErrCorrupt) instead of the plugin failing every start.
func TestUnreadableFileIsCorrupt(t *testing.T) {
	s := NewStore(t.TempDir())
	if err := os.Mkdir(s.Path(), 0o700); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Load(); !errors.Is(err, ErrCorrupt) {
		t.Errorf("load of a directory in the file's place: %v, want ErrCorrupt", err)
	}
	if err := s.Quarantine(); err != nil {
		t.Fatal(err)
	}
	if err := s.Save(sample()); err != nil {
		t.Fatalf("save after setting the unreadable file aside: %v", err)
	}
	if got, _, err := s.Load(); err != nil || !reflect.DeepEqual(got, sample()) {
		t.Errorf("load after the save: %v", err)
	}
}

// A file whose checksums match but whose content contradicts itself is
// corrupt, as a torn one is: the previous copy is used instead.
func TestContradictoryStateIsCorrupt(t *testing.T) {
	tests := []struct {
		name   string
		change func(st *State)
		want   string
	}{
		{"seats without generations", func(st *State) { st.Claims["uid-1"].Devices[0].Generations = nil }, "1 seats and 0 generations"},
		{"more GPUs than UUIDs", func(st *State) { st.Claims["uid-1"].Devices[0].GPUUUIDs = []string{"GPU-a"} }, "2 GPUs and 1 GPU UUIDs"},
		{"negative seat", func(st *State) { st.Claims["uid-1"].Devices[0].Seats = []int{-1} }, "seats [-1]: want distinct seats that are not negative"},
		{"a seat twice in a device", func(st *State) {
			d := &st.Claims["uid-1"].Devices[0]
			d.Seats, d.Generations = []int{0, 0}, []int64{3, 3}
		}, "seats [0 0]"},
		{"no requests", func(st *State) { st.Claims["uid-1"].Devices[0].Requests = nil }, "want at least one, none empty"},
		{"an empty request", func(st *State) { st.Claims["uid-1"].Devices[0].Requests = []string{""} }, "want at least one, none empty"},
		{"no GPUs", func(st *State) {
			d := &st.Claims["uid-1"].Devices[0]
			d.GPUs, d.GPUUUIDs = nil, nil
		}, "0 GPUs and 0 GPU UUIDs"},
		{"a seat held by two claims", func(st *State) {
			c := *st.Claims["uid-1"]
			c.Devices = []Device{c.Devices[0]}
			c.Devices[0].ShareID, c.Devices[0].CDIDevice = "share-2", "g01-2x-share-2"
			st.Claims["uid-2"] = &c
		}, "seat 0 of g01-2x is also held by claim uid-1"},
		{"a generation above its record", func(st *State) { st.Generations["g01-2x/0"] = 2 }, "seat 0 has generation 3, above the 2 recorded for it"},
		{"generation zero", func(st *State) {
			st.Claims["uid-1"].Devices[0].Generations = []int64{0}
		}, "generations [0]"},
		{"fenced device with seats", func(st *State) { st.Claims["uid-1"].Devices[0].Fenced = true }, "a fenced device or one with admin access records no seats"},
		{"admin access with seats", func(st *State) { st.Claims["uid-1"].Devices[0].AdminAccess = true }, "a fenced device or one with admin access records no seats"},
		{"admin access, fenced", func(st *State) {
			d := &st.Claims["uid-1"].Devices[0]
			d.AdminAccess, d.Fenced, d.Seats, d.Generations = true, true, nil, nil
		}, "cannot be fenced"},
		{"a CDI device name no runtime accepts", func(st *State) { st.Claims["uid-1"].Devices[0].CDIDevice = "../etc" }, `CDI device "../etc" is not a CDI device name`},
		{"unknown phase", func(st *State) { st.Claims["uid-1"].Phase = "Prepared?" }, `unknown phase "Prepared?"`},
		{"a claim without a name", func(st *State) { st.Claims["uid-1"].Name = "" }, "has no namespace or name"},
		{"a nil claim", func(st *State) { st.Claims["uid-3"] = nil }, "claim uid-3 has no entry"},
		{"a malformed generation key", func(st *State) { st.Generations["g01-2x"] = 1 }, `generations["g01-2x"] = 1`},
		{"negative floor", func(st *State) { st.GenerationFloor = -1 }, "generationFloor -1 is not between 0 and"},
		// Raising the floor past a lost save adds to the largest count:
		// a count near the largest int64 would overflow into negatives.
		{"a floor past the bound", func(st *State) { st.GenerationFloor = MaxGeneration + 1 }, "generationFloor 4611686018427387905 is not between"},
		{"a count past the bound", func(st *State) { st.Generations["g01-2x/0"] = math.MaxInt64 }, `generations["g01-2x/0"] = 9223372036854775807`},
		{"a claim UID no spec can be written for", func(st *State) {
			st.Claims["../../etc/x"] = st.Claims["uid-1"]
			delete(st.Claims, "uid-1")
		}, `claim UID "../../etc/x" is not a safe file name`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := sample()
			tt.change(st)
			raw, err := Encode(st)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := Decode(raw, "x"); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("decode: %v, want corrupt: %q", err, tt.want)
			}
			// The store falls back to the previous copy.
			s := NewStore(t.TempDir())
			if err := s.Save(sample()); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(s.Path(), s.prevPath()); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(s.Path(), raw, 0o600); err != nil {
				t.Fatal(err)
			}
			got, res, err := s.Load()
			if err != nil || res.RecoveredFrom == nil || !reflect.DeepEqual(got, sample()) {
				t.Errorf("load: %+v %v, want the previous copy", res, err)
			}
		})
	}
}

// A damaged version is a damaged file, not a newer one: the previous copy
// is used and the plugin starts.
func TestDamagedVersionFallsBackToThePreviousCopy(t *testing.T) {
	raw, err := Encode(sample())
	if err != nil {
		t.Fatal(err)
	}
	data := `{"claims":{}}`
	for name, bad := range map[string][]byte{
		"a flipped bit":                   bytes.Replace(raw, []byte(`"version":"v1"`), []byte(`"version":"v3"`), 1),
		"an older version":                bytes.Replace(raw, []byte(`"version":"v1"`), []byte(`"version":"v0"`), 1),
		"no version number":               bytes.Replace(raw, []byte(`"version":"v1"`), []byte(`"version":"w1"`), 1),
		"a newer version without its sum": []byte(`{"version":"v9","checksum":"` + checksum([]byte(data)) + `","data":` + data + `}`),
		"a v2 file named v1":              []byte(`{"version":"v1","checksum":"` + checksum([]byte(data)) + `","sum":"` + sum("v2", []byte(data)) + `","data":` + data + `}`),
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := Decode(bad, "x"); !errors.Is(err, ErrCorrupt) || errors.Is(err, ErrNewerVersion) {
				t.Fatalf("decode: %v, want corrupt", err)
			}
			s := NewStore(t.TempDir())
			if err := s.Save(sample()); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(s.Path(), s.prevPath()); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(s.Path(), bad, 0o600); err != nil {
				t.Fatal(err)
			}
			got, res, err := s.Load()
			if err != nil || res.RecoveredFrom == nil || !reflect.DeepEqual(got, sample()) {
				t.Errorf("load: %+v %v, want the previous copy", res, err)
			}
		})
	}
}

// A plugin writes the oldest version that holds its state, so that a
// rollback keeps working: v1, with a sum older plugins ignore, unless a
// device is fenced.
func TestWritesTheOldestVersionThatHoldsTheState(t *testing.T) {
	raw, err := Encode(sample())
	if err != nil {
		t.Fatal(err)
	}
	var env envelope
	if err := json.Unmarshal(raw, &env); err != nil {
		t.Fatal(err)
	}
	if env.Version != V1 || env.Checksum != checksum(env.Data) || env.Sum == "" {
		t.Errorf("plain state written as %s, checksum %s (data %s), sum %q", env.Version, env.Checksum, checksum(env.Data), env.Sum)
	}
	st := sample()
	d := &st.Claims["uid-1"].Devices[0]
	d.Fenced, d.Seats, d.Generations = true, nil, nil
	raw, err = Encode(st)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &env); err != nil {
		t.Fatal(err)
	}
	back, err := Decode(raw, "fenced")
	if env.Version != V2 || err != nil || !reflect.DeepEqual(back, st) {
		t.Errorf("fenced state written as %s; decoded: %v", env.Version, err)
	}
}

func TestSeats(t *testing.T) {
	st := sample()
	free, err := st.FreeSeats("g01-2x", 3, 2)
	if err != nil || len(free) != 2 || free[0] != 1 || free[1] != 2 {
		t.Errorf("free seats %v %v, want [1 2]", free, err)
	}
	if _, err := st.FreeSeats("g01-2x", 3, 3); err == nil || !strings.Contains(err.Error(), "2 free seat(s) of 3, 3 needed") {
		t.Errorf("too many seats: %v", err)
	}
	if g := st.NextGeneration("g01-2x", 0); g != 4 {
		t.Errorf("next generation %d, want 4", g)
	}
	if g := st.NextGeneration("g23-2x", 1); g != 1 {
		t.Errorf("first generation %d, want 1", g)
	}
	fenced := sample()
	fenced.Claims["uid-2"] = &Claim{Namespace: "default", Name: "lost", Phase: PrepareCompleted, Devices: []Device{{
		Requests: []string{"gpu"}, Pool: "node-1", Device: "g23-2x", GroupDevice: "g23-2x", CDIDevice: "g23-2x",
		SeatStatus: v1alpha1.SeatStatus{Profile: "2x", Group: "G23", GPUs: []int{2, 3}, GPUUUIDs: []string{"GPU-c", "GPU-d"}},
		Fenced:     true,
	}}}
	if _, err := fenced.FreeSeats("g23-2x", 3, 1); err == nil || !strings.Contains(err.Error(), "device g23-2x is fenced: the seats claim uid-2 holds on it are not known") {
		t.Errorf("a fenced group: %v", err)
	}
	if free, err := fenced.FreeSeats("g01-2x", 3, 1); err != nil || free[0] != 1 {
		t.Errorf("another group beside a fenced one: %v %v", free, err)
	}
}

func TestTempFilesDoNotLinger(t *testing.T) {
	dir := t.TempDir()
	s := NewStore(dir)
	for i := 0; i < 3; i++ {
		if err := s.Save(sample()); err != nil {
			t.Fatal(err)
		}
	}
	// Saves put dropped copies aside; the flush deletes them.
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != FileName+" "+FileName+".prev" {
		t.Errorf("files left in %s: %v", filepath.Base(dir), names)
	}
}

// The fixture is a v1 checkpoint as an earlier release wrote it: its own
// field order and indentation, and a field a later minor release added.
// The checksum covers the stored bytes, so it still verifies; unknown
// fields are ignored; phases and seats read back exactly.
func TestReadsTheV1Fixture(t *testing.T) {
	raw, err := os.ReadFile("testdata/checkpoint-v1.json")
	if err != nil {
		t.Fatal(err)
	}
	st, err := Decode(raw, "testdata/checkpoint-v1.json")
	if err != nil {
		t.Fatalf("a v1 checkpoint must stay readable: %v", err)
	}
	train := st.Claims["6a1f0e2c-9b1d-4c3e-8f7a-2d3c4b5a6978"]
	infer := st.Claims["7b2e1f3d-0c2e-4d4f-9a8b-3e4d5c6b7a89"]
	if train == nil || train.Phase != PrepareCompleted || train.Devices[0].Seats[0] != 0 || train.Devices[0].Generations[0] != 3 || train.Devices[0].ShareID != "3c2b1a09-8f7e-4d6c-5b4a-392817060504" {
		t.Errorf("train: %+v", train)
	}
	if infer == nil || infer.Phase != PrepareStarted || infer.Devices[0].GroupDevice != "g4-1x" {
		t.Errorf("infer: %+v", infer)
	}
	if st.Generations["g4-1x/0"] != 7 || st.NextGeneration("g4-1x", 0) != 8 {
		t.Errorf("generations %v", st.Generations)
	}
	// One changed byte in the data is caught.
	if _, err := Decode(bytes.Replace(raw, []byte(`"generations": [3]`), []byte(`"generations": [4]`), 1), "edited"); !errors.Is(err, ErrCorrupt) {
		t.Errorf("an edited checkpoint must fail its checksum: %v", err)
	}
}

// Admin access needs version 3: the file is written so, and a v2 file
// claiming admin access is corrupt (a v2 plugin could not read it right).
func TestAdminAccessIsVersion3(t *testing.T) {
	st := sample()
	d := &st.Claims["uid-1"].Devices[0]
	d.AdminAccess, d.Seats, d.Generations = true, nil, nil
	raw, err := Encode(st)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(raw, []byte(`"version":"v3"`)) {
		t.Fatalf("admin access encoded as %.40s", raw)
	}
	back, err := Decode(raw, "x")
	if err != nil || !back.Claims["uid-1"].Devices[0].AdminAccess {
		t.Fatalf("decode: %v", err)
	}
	data, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	v2 := `{"version":"v2","checksum":"` + checksum(data) + `","sum":"` + sum("v2", data) + `","data":` + string(data) + `}`
	if _, err := Decode([]byte(v2), "x"); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "cannot hold devices with admin access") {
		t.Errorf("v2 with admin access: %v", err)
	}
}

// A sized seat needs version 4: an older plugin would read it as an
// equal share of its group, so a file holding one is written so, and a
// v3 file claiming one is corrupt.
func TestSizedSeatsAreVersion4(t *testing.T) {
	st := sample()
	st.Claims["uid-1"].Devices[0].Size = &v1alpha1.SeatSize{MemoryBytes: 20 << 30, ComputePercent: 25}
	raw, err := Encode(st)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(raw, []byte(`"version":"v4"`)) || !bytes.Contains(raw, []byte(`"size":{"memoryBytes":21474836480,"computePercent":25}`)) {
		t.Fatalf("a sized seat encoded as %s", raw)
	}
	back, err := Decode(raw, "x")
	if err != nil || !reflect.DeepEqual(back, st) {
		t.Fatalf("decode: %v", err)
	}
	data, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	v3 := `{"version":"v3","checksum":"` + checksum(data) + `","sum":"` + sum("v3", data) + `","data":` + string(data) + `}`
	if _, err := Decode([]byte(v3), "x"); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "a v3 file cannot hold sized seats") {
		t.Errorf("v3 with a sized seat: %v", err)
	}
}

func TestSizesThatContradictTheSeatAreCorrupt(t *testing.T) {
	tests := []struct {
		name   string
		change func(d *Device)
		want   string
	}{
		{"two seats of one size", func(d *Device) {
			d.Seats, d.Generations = []int{0, 1}, []int64{3, 1}
		}, "a sized seat's device holds one seat, not 2"},
		{"no memory", func(d *Device) { d.Size.MemoryBytes = 0 }, "want memory of 1 byte or more and compute between 1 and 100"},
		{"compute past the SMs", func(d *Device) { d.Size.ComputePercent = 101 }, "want memory of 1 byte or more and compute between 1 and 100"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := sample()
			st.Generations["g01-2x/1"] = 1
			d := &st.Claims["uid-1"].Devices[0]
			d.Size = &v1alpha1.SeatSize{MemoryBytes: 20 << 30, ComputePercent: 25}
			tt.change(d)
			raw, err := Encode(st)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := Decode(raw, "x"); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("decode: %v, want it corrupt: %q", err, tt.want)
			}
		})
	}
}
