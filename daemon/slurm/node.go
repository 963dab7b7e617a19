package slurm

import (
	"fmt"
	"regexp"
	"strings"
)

// ReasonPrefix starts the reason of every drain tier0 makes. A drain whose
// reason does not start with it belongs to someone else (an administrator,
// Slurm itself) and tier0 never undoes it.
const ReasonPrefix = "tier0:"

// IsTier0Reason reports whether a drain reason is tier0's own.
func IsTier0Reason(reason string) bool {
	return strings.HasPrefix(strings.TrimSpace(reason), ReasonPrefix)
}

// Tier0Reason turns a problem description into a drain reason owned by
// tier0: it adds ReasonPrefix when missing, folds the text onto one line and
// caps its length (Slurm shows reasons in narrow columns).
func Tier0Reason(problem string) string {
	r := strings.Join(strings.Fields(problem), " ")
	if !IsTier0Reason(r) {
		r = ReasonPrefix + " " + r
	}
	const maxLen = 200
	if len(r) > maxLen {
		r = r[:maxLen]
	}
	return r
}

// Node is one node as `scontrol show node -o` reports it.
type Node struct {
	// Name is NodeName.
	Name string
	// State is the full state word, for example "IDLE+DRAIN".
	State string
	// Base is the base state (IDLE, ALLOCATED, MIXED, DOWN, ...).
	Base string
	// Flags are the state flags after the base (DRAIN, NOT_RESPONDING, ...).
	Flags []string
	// Reason is the drain or down reason, without the "[user@time]" suffix
	// that Slurm appends; empty when there is none.
	Reason string
	// ReasonUser and ReasonTime come from that suffix when present.
	ReasonUser, ReasonTime string
	// Fields holds every Key=Value of the line (Reason included, raw).
	Fields map[string]string
}

// HasFlag reports whether the state carries flag f (case-insensitive).
func (n Node) HasFlag(f string) bool {
	for _, x := range n.Flags {
		if strings.EqualFold(x, f) {
			return true
		}
	}
	return false
}

// Drained reports whether the node is draining or drained.
func (n Node) Drained() bool { return n.HasFlag("DRAIN") }

// Down reports whether the node's base state is DOWN.
func (n Node) Down() bool { return strings.EqualFold(n.Base, "DOWN") }

// Unavailable reports whether the node is drained or down, that is, kept
// from new jobs by someone.
func (n Node) Unavailable() bool { return n.Drained() || n.Down() }

// OwnedByTier0 reports whether the node is drained or down by tier0.
func (n Node) OwnedByTier0() bool { return n.Unavailable() && IsTier0Reason(n.Reason) }

var (
	keyRE        = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_/:]*=`)
	reasonSuffix = regexp.MustCompile(`\s*\[([^\[\]@\s]+)@([0-9T:\-]+)\]\s*$`)
)

// ParseShowNode parses the output of `scontrol show node -o`: one node per
// non-empty line, fields separated by spaces, Reason last. Values with spaces
// (OS=..., Reason=...) are kept whole.
func ParseShowNode(out string) ([]Node, error) {
	var nodes []Node
	for i, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		n, err := parseNodeLine(line)
		if err != nil {
			return nil, fmt.Errorf("scontrol show node line %d: %w", i+1, err)
		}
		nodes = append(nodes, n)
	}
	return nodes, nil
}

func parseNodeLine(line string) (Node, error) {
	if !strings.HasPrefix(line, "NodeName=") {
		return Node{}, fmt.Errorf("%q does not start with NodeName= (expected `scontrol show node -o` output)", clip(line))
	}
	n := Node{Fields: map[string]string{}}
	// Reason is free text and comes last; cut it off before splitting.
	head, reason, hasReason := line, "", false
	if i := strings.Index(line, " Reason="); i >= 0 {
		head, reason, hasReason = line[:i], line[i+len(" Reason="):], true
	}
	var key string
	for _, tok := range strings.Fields(head) {
		if keyRE.MatchString(tok) {
			k, v, _ := strings.Cut(tok, "=")
			key = k
			n.Fields[k] = v
			continue
		}
		if key != "" { // continuation of a value with spaces
			n.Fields[key] += " " + tok
		}
	}
	if hasReason {
		n.Fields["Reason"] = reason
		if m := reasonSuffix.FindStringSubmatchIndex(reason); m != nil {
			n.ReasonUser = reason[m[2]:m[3]]
			n.ReasonTime = reason[m[4]:m[5]]
			reason = reason[:m[0]]
		}
		n.Reason = strings.TrimSpace(reason)
	}
	n.Name = n.Fields["NodeName"]
	if n.Name == "" {
		return Node{}, fmt.Errorf("%q has an empty NodeName", clip(line))
	}
	n.State = n.Fields["State"]
	if n.State == "" {
		return Node{}, fmt.Errorf("node %s: no State= field in %q", n.Name, clip(line))
	}
	parts := strings.Split(strings.TrimRight(n.State, "*~#%$@!^-"), "+")
	n.Base, n.Flags = parts[0], parts[1:]
	return n, nil
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
