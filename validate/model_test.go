package validate

import (
	"testing"

	"tier0/daemon/blockdev"
	"tier0/daemon/config"
)

// TestLocalSiteRunsUnderTheModel: site-configs/local-5node.yaml shapes
// every drive (the raw bench's too) to the Micron 7450 profile, scaled,
// and the results say so; an existing cluster's run records no model.
func TestLocalSiteRunsUnderTheModel(t *testing.T) {
	t.Setenv(config.EnvModelScale, "")
	work := t.TempDir()
	t.Setenv("TIER0_WORK", work)
	cfg, err := config.Load("../site-configs/local-5node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	m := modelInfo(cfg, true)
	if m == nil || m.Profile != "micron-7450-pro-3.84tb" || m.Scale != 0.0005 || m.Drive.ReadBytesPerS != 3.4e6 || m.Drive.WriteIOPS != 90 || m.LinkBytesPerS != 50e6 {
		t.Fatalf("model info %+v; want the 7450 profile at 1/2000 with the link", m)
	}
	if modelInfo(cfg, false) != nil {
		t.Error("a run on an existing cluster claims the local model")
	}
	devs, err := openDrives(cfg, discardLog())
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, d := range devs {
			d.dev.Close()
		}
	}()
	if len(devs) != 20 {
		t.Fatalf("%d drives, want 20", len(devs))
	}
	for _, d := range devs {
		sh, ok := d.dev.(interface{ Model() blockdev.Model })
		if !ok || sh.Model().ReadIOPS != 500 {
			t.Fatalf("raw bench drive %s is not shaped to the model (%T)", d.name, d.dev)
		}
	}
}
