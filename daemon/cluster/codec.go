package cluster

import (
	"encoding/json"
	"fmt"
	"reflect"
)

// Actions and events travel between nodes (through the store) as JSON
// envelopes {"type":"fence","body":{...}}; the field names are the Go
// field names. MarshalAction/UnmarshalAction and MarshalEvent/
// UnmarshalEvent convert them; unknown types and malformed bodies are
// refused with ErrBadConfig.

type envelope struct {
	Type string          `json:"type"`
	Body json.RawMessage `json:"body"`
}

var actionTypes = map[string]reflect.Type{}
var eventTypes = map[string]reflect.Type{}
var typeNames = map[reflect.Type]string{}

func register(m map[string]reflect.Type, name string, v any) {
	t := reflect.TypeOf(v)
	m[name] = t
	typeNames[t] = name
}

func init() {
	for name, v := range map[string]Action{
		"fence": Fence{}, "assemble": Assemble{}, "release": Release{}, "set-ana": SetANA{},
		"export": Export{}, "resync": Resync{}, "rebuild": Rebuild{}, "self-fence": SelfFence{},
		"slurm-drain": SlurmDrain{}, "slurm-resume": SlurmResume{}, "record-event": RecordEvent{},
	} {
		register(actionTypes, name, v)
	}
	for name, v := range map[string]Event{
		"node-joined": NodeJoined{}, "heartbeat": Heartbeat{}, "lease-expired": LeaseExpired{},
		"node-returned": NodeReturned{}, "self-lease-lost": SelfLeaseLost{},
		"partition-suspected": PartitionSuspected{}, "partition-cleared": PartitionCleared{},
		"array-defined": ArrayDefined{}, "array-removed": ArrayRemoved{}, "fence-done": FenceDone{}, "fence-failed": FenceFailed{},
		"ownership-acquired": OwnershipAcquired{}, "ownership-lost": OwnershipLost{},
		"array-assembled": ArrayAssembled{}, "assemble-failed": AssembleFailed{}, "released": Released{},
		"resync-done": ResyncDone{}, "rebuild-progress": RebuildProgress{}, "rebuild-done": RebuildDone{},
		"member-failed": MemberFailed{}, "drive-replaced": DriveReplaced{}, "drain-requested": DrainRequested{},
		"undrain-requested": UndrainRequested{}, "failback-requested": FailbackRequested{},
		"array-observed": ArrayObserved{}, "array-failed": ArrayFailed{}, "repair-failed": RepairFailed{},
	} {
		register(eventTypes, name, v)
	}
}

func marshal(v any) ([]byte, error) {
	name, ok := typeNames[reflect.TypeOf(v)]
	if !ok {
		return nil, fmt.Errorf("cannot encode %T: %w", v, ErrBadConfig)
	}
	body, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return json.Marshal(envelope{Type: name, Body: body})
}

func unmarshal(b []byte, types map[string]reflect.Type, what string) (any, error) {
	var env envelope
	if err := json.Unmarshal(b, &env); err != nil {
		return nil, fmt.Errorf("%s is not a JSON envelope: %v: %w", what, err, ErrBadConfig)
	}
	t, ok := types[env.Type]
	if !ok {
		return nil, fmt.Errorf("unknown %s type %q: %w", what, env.Type, ErrBadConfig)
	}
	p := reflect.New(t)
	if len(env.Body) > 0 {
		if err := json.Unmarshal(env.Body, p.Interface()); err != nil {
			return nil, fmt.Errorf("%s %q body: %v: %w", what, env.Type, err, ErrBadConfig)
		}
	}
	return p.Elem().Interface(), nil
}

// MarshalAction encodes an action for delivery to its performer.
func MarshalAction(a Action) ([]byte, error) { return marshal(a) }

// UnmarshalAction decodes what MarshalAction produced.
func UnmarshalAction(b []byte) (Action, error) {
	v, err := unmarshal(b, actionTypes, "action")
	if err != nil {
		return nil, err
	}
	return v.(Action), nil
}

// MarshalEvent encodes an event (a performer's report, a request).
func MarshalEvent(e Event) ([]byte, error) { return marshal(e) }

// UnmarshalEvent decodes what MarshalEvent produced.
func UnmarshalEvent(b []byte) (Event, error) {
	v, err := unmarshal(b, eventTypes, "event")
	if err != nil {
		return nil, err
	}
	return v.(Event), nil
}
