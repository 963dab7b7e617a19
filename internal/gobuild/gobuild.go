package gobuild

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// ErrNoGo: the go tool is not on $PATH.
var ErrNoGo = errors.New("the go tool is not on $PATH")

// BuildBinaries builds the commands tier0/cmd/NAME of this module, one go
// build for all of them, into dir, and returns their paths in the order of
// names. They are built without -race (a `go test -race` run does not
// pass it on): they run as their own processes, which the race detector
// would slow several-fold. GOFLAGS=-buildvcs=false lets a tree without its
// .git build.
func BuildBinaries(dir string, names ...string) ([]string, error) {
	if len(names) == 0 {
		return nil, errors.New("gobuild: no command named; expected names under cmd/, such as tier0d")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return nil, fmt.Errorf("%w (%v): it builds %s", ErrNoGo, err, strings.Join(names, ", "))
	}
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	paths := make([]string, len(names))
	for i, n := range names {
		if n == "" || strings.ContainsAny(n, `/\`) {
			return nil, fmt.Errorf("gobuild: command %q: expected the name of a folder under cmd/, such as tier0d", n)
		}
		args = append(args, "tier0/cmd/"+n)
		paths[i] = filepath.Join(dir, n)
	}
	cmd := exec.Command(goBin, args...)
	cmd.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return paths, nil
}
