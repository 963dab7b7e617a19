package cluster

import (
	"errors"
	"reflect"
	"sort"
	"testing"
)

// TestEveryEventHasAStepFunction: step hands every event type the codec
// knows to the step function of its concern; none falls through to the
// "unknown event" answer, which only a nil event gets.
func TestEveryEventHasAStepFunction(t *testing.T) {
	names := make([]string, 0, len(eventTypes))
	for name := range eventTypes {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		ev := reflect.Zero(eventTypes[name]).Interface().(Event)
		m, err := New(Config{}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.step(ev); err != nil && err.Error() == badEvent(ev).Error() {
			t.Errorf("event %q (%T): no step function takes it: %v", name, ev, err)
		}
	}
	m, _ := New(Config{}, nil)
	if err := m.Step(nil); !errors.Is(err, ErrBadConfig) {
		t.Errorf("Step(nil) = %v, want an error wrapping ErrBadConfig", err)
	}
}
