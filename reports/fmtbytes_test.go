package reports

import (
	"strings"
	"testing"

	"tier0/bench"
)

// TestRunSummaryMemoryInTiB: the host's memory is written by the one
// byte formatter (internal/units), so a host of 1.5 TiB reads
// "1.50 TiB memory", not "1536.00 GiB" as the report's own copy had it.
func TestRunSummaryMemoryInTiB(t *testing.T) {
	res := &bench.Results{Environment: bench.Environment{MemoryBytes: 3 << 39}}
	got := strings.Join(runSummary(res), "\n")
	if !strings.Contains(got, "1.50 TiB memory") {
		t.Errorf("run summary of a host with %d bytes of memory:\n%s\nwant it to say \"1.50 TiB memory\"", uint64(3<<39), got)
	}
}
