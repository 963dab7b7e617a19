package bench_test

import (
	"context"
	"fmt"

	"tier0/bench"
	"tier0/daemon/blockdev"
)

// Fill a device through a fault injector that corrupts one 4 KiB block on
// its way to the medium, then verify: exactly that block is reported.
func ExampleRun_verify() {
	mem := blockdev.NewMem(4<<20, 512)
	f := blockdev.NewFault(mem)
	f.AddRule(blockdev.Rule{Op: blockdev.OpWrite, Off: 1 << 20, Len: 4096, Action: blockdev.Corrupt})
	ctx := context.Background()
	if _, err := bench.Fill(ctx, 1, 4, []bench.Target{{ID: "A1", Dev: f}}); err != nil {
		panic(err)
	}
	res, err := bench.Run(ctx, bench.Config{Pattern: bench.SeqRead, IOSize: 1 << 20, QueueDepth: 2, Passes: 1, Verify: true, MinGeneration: 1},
		[]bench.Target{{ID: "A1", Dev: mem}})
	if err != nil {
		panic(err)
	}
	fmt.Printf("checked %d, ok %d, corrupt %d\n", res.Verify.Checked, res.Verify.OK, res.Verify.Corrupt)
	fmt.Println(res.VerifyErr())
	// Output:
	// checked 1024, ok 1023, corrupt 1
	// 1 of 1024 units bad (corrupt 1, misplaced 0, stale 0, unwritten 0): bench: verification failed
}
