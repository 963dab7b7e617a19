// Command tier0d is the tier0 node daemon.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "tier0d: the node daemon is being assembled; see docs/ARCHITECTURE.md")
	os.Exit(2)
}
