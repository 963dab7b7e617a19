package fakescontrol

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const script = `#!/bin/sh
d=$(dirname "$0")/state
echo "$*" >> "$d/calls"
if [ -f "$d/sleep" ]; then sleep "$(cat "$d/sleep")"; fi
if [ -f "$d/fail" ]; then
  n=$(cat "$d/fail")
  if [ "$n" -gt 0 ]; then
    echo $((n-1)) > "$d/fail"
    echo "slurm_load_node error: Unable to contact slurm controller (connect failure)" >&2
    exit 1
  fi
fi
case "$1" in
show)
  if [ -n "$4" ]; then
    [ -d "$d/nodes/$4" ] || { echo "Node $4 not found" >&2; exit 1; }
    set -- "$4"
  else
    set -- $(ls "$d/nodes")
  fi
  for n in "$@"; do
    st=$(cat "$d/nodes/$n/state"); r=$(cat "$d/nodes/$n/reason")
    line="NodeName=$n Arch=x86_64 CoresPerSocket=1  CPUTot=1 OS=Linux 6.1.0 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=1000 State=$st ThreadsPerCore=1 Partitions=debug  ExtSensorsTemp=n/s"
    [ -n "$r" ] && line="$line Reason=$r [root@2026-11-29T18:33:28]"
    echo "$line"
  done
  ;;
update)
  n= s= r=
  for a in "$@"; do
    case "$a" in
    nodename=*) n=${a#nodename=} ;;
    state=*) s=${a#state=} ;;
    reason=*) r=${a#reason=} ;;
    esac
  done
  nd="$d/nodes/$n"
  [ -n "$n" ] && [ -d "$nd" ] || { echo "slurm_update error: Invalid node name specified" >&2; exit 1; }
  cur=$(cat "$nd/state")
  case "$s" in
  drain)
    [ -n "$r" ] || { echo "You must specify a reason when DOWNING or DRAINING a node. Request denied" >&2; exit 1; }
    base=${cur%%+*}; echo "$base+DRAIN" > "$nd/state"; printf '%s\n' "$r" > "$nd/reason" ;;
  down)
    [ -n "$r" ] || { echo "You must specify a reason when DOWNING or DRAINING a node. Request denied" >&2; exit 1; }
    echo DOWN > "$nd/state"; printf '%s\n' "$r" > "$nd/reason" ;;
  resume)
    case "$cur" in
    *DRAIN*|DOWN*) echo IDLE > "$nd/state"; : > "$nd/reason" ;;
    *) echo "slurm_update error: Invalid node state specified" >&2; exit 1 ;;
    esac ;;
  *) echo "slurm_update error: Invalid node state specified" >&2; exit 1 ;;
  esac
  ;;
*) echo "invalid keyword: $1" >&2; exit 1 ;;
esac
`

// Fake is one installed fake scontrol.
type Fake struct {
	t testing.TB
	// Path is the absolute path of the fake scontrol.
	Path string
	dir  string
}

// New installs a fake scontrol in a temporary directory with the given
// nodes, all IDLE without reason.
func New(t testing.TB, nodes ...string) *Fake {
	t.Helper()
	root := t.TempDir()
	f := &Fake{t: t, Path: filepath.Join(root, "scontrol"), dir: filepath.Join(root, "state")}
	if err := os.WriteFile(f.Path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if err := os.MkdirAll(filepath.Join(f.dir, "nodes", n), 0o755); err != nil {
			t.Fatal(err)
		}
		f.Set(n, "IDLE", "")
	}
	return f
}

func (f *Fake) write(name, content string) {
	f.t.Helper()
	if err := os.WriteFile(filepath.Join(f.dir, name), []byte(content), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

func (f *Fake) read(name string) string {
	b, err := os.ReadFile(filepath.Join(f.dir, name))
	if err != nil && !os.IsNotExist(err) {
		f.t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// Set sets a node's state word (for example "IDLE+DRAIN") and reason.
func (f *Fake) Set(node, state, reason string) {
	f.t.Helper()
	f.write(filepath.Join("nodes", node, "state"), state+"\n")
	f.write(filepath.Join("nodes", node, "reason"), reason+"\n")
}

// Get returns a node's state word and reason.
func (f *Fake) Get(node string) (state, reason string) {
	f.t.Helper()
	return f.read(filepath.Join("nodes", node, "state")), f.read(filepath.Join("nodes", node, "reason"))
}

// FailNext makes the next n calls fail as if slurmctld were unreachable.
func (f *Fake) FailNext(n int) {
	f.t.Helper()
	f.write("fail", strconv.Itoa(n)+"\n")
}

// Hang makes every call sleep secs seconds first ("" stops it).
func (f *Fake) Hang(secs string) {
	f.t.Helper()
	if secs == "" {
		_ = os.Remove(filepath.Join(f.dir, "sleep"))
		return
	}
	f.write("sleep", secs+"\n")
}

// Calls returns the argument lines of every call so far.
func (f *Fake) Calls() []string {
	f.t.Helper()
	s := f.read("calls")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// Updates returns only the update calls.
func (f *Fake) Updates() []string {
	var u []string
	for _, c := range f.Calls() {
		if strings.HasPrefix(c, "update") {
			u = append(u, c)
		}
	}
	return u
}
