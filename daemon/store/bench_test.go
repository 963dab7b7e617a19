package store

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkStore measures, on one embedded member over loopback, a plain
// put (the baseline), an ownership claim (read + compare-and-swap
// transaction), an event-log append (guarded create) and a guarded
// enqueue, in the same run so their ratios are meaningful.
func BenchmarkStore(b *testing.B) {
	ps := []Peer{{Name: "n0", ClientURL: fmt.Sprintf("http://127.0.0.1:%d", freePortB(b)), PeerURL: fmt.Sprintf("http://127.0.0.1:%d", freePortB(b))}}
	s, err := Open(b.Context(), Options{Name: "n0", Peers: ps, DataDir: b.TempDir(), TickMs: 10, ElectionMs: 100})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	ctx := b.Context()
	l, err := s.Register(ctx, NodeInfo{Node: "A"}, 10*time.Second, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close(ctx)
	b.Run("put", func(b *testing.B) {
		for b.Loop() {
			if _, err := s.Put(ctx, Observed, "arrays", "a", "x"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("claim", func(b *testing.B) {
		var epoch uint64
		for b.Loop() {
			epoch++
			if _, err := s.ClaimOwnership(ctx, "bench", "A", epoch); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("event", func(b *testing.B) {
		for b.Loop() {
			if _, err := s.AppendEvent(ctx, Event{Kind: "bench"}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("enqueue", func(b *testing.B) {
		for b.Loop() {
			if _, err := s.Enqueue(ctx, nil, "bench", []byte("x")); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func freePortB(b *testing.B) int { return freePortTB(b) }
