package checkpoint

import (
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/types"
)

// BenchmarkSave is one checkpoint save of a node with 64 prepared claims:
// what every batch of prepares pays on its path. The flush runs behind the
// calls, as the plugin's flusher does, and is not timed.
func BenchmarkSave(b *testing.B) {
	s := NewStore(b.TempDir())
	st := New()
	for i := 0; i < 64; i++ {
		c := *sample().Claims["uid-1"]
		c.Name = fmt.Sprintf("claim-%d", i)
		st.Claims[types.UID(fmt.Sprintf("uid-%d", i))] = &c
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := s.Save(st); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := s.Sync(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

func BenchmarkEncode(b *testing.B) {
	st := New()
	for i := 0; i < 64; i++ {
		c := *sample().Claims["uid-1"]
		st.Claims[types.UID(fmt.Sprintf("uid-%d", i))] = &c
	}
	for i := 0; i < b.N; i++ {
		if _, err := Encode(st); err != nil {
			b.Fatal(err)
		}
	}
}
