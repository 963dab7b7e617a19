package node

import (
	"testing"

	"tier0/daemon/config"
	"tier0/daemon/target"
)

// The largest site the configuration accepts starts a frontend and a
// backend on every node: the last node's controller ID range is valid.
func TestControllerIDRangeOfLastNode(t *testing.T) {
	for _, idx := range []int{0, config.MaxNodes - 1} {
		base, count := config.CntlIDRange(idx)
		tg, err := target.New(target.Config{CntlIDBase: base, CntlIDCount: count})
		if err != nil {
			t.Fatalf("node index %d: controller IDs [%d, %d): %v", idx, base, int(base)+int(count), err)
		}
		tg.Close()
	}
}
