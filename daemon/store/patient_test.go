package store

import (
	"testing"
	"time"
)

// The per-member deadlines are today's at the default election timeout
// (and below it) and grow with a longer one.
func TestPatientScalesWithElection(t *testing.T) {
	for _, c := range []struct {
		electionMs uint
		want       time.Duration
	}{{0, time.Second}, {100, time.Second}, {500, time.Second}, {999, time.Second}, {1000, 2 * time.Second}, {5000, 10 * time.Second}} {
		s := &Store{opts: Options{ElectionMs: c.electionMs}}
		if got := s.patient(readTry); got != c.want {
			t.Errorf("election %d ms: read try %v, want %v", c.electionMs, got, c.want)
		}
	}
}
