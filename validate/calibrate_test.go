package validate

import (
	"context"
	"errors"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"tier0/bench"
	"tier0/daemon/blockdev"
	"tier0/daemon/config"
)

// cpuLimited is a fake calibration measurement: the modelled drives
// deliver 97% of their capacity (20 drives × 1M read IOPS × s), and this
// machine's CPUs never more than cpuIOPS.
func cpuLimited(cpuIOPS float64, calls *[]float64) measureFunc {
	return func(_ context.Context, s float64) (float64, float64, error) {
		*calls = append(*calls, s)
		modelled := 20 * 1e6 * s
		return math.Min(0.97*modelled, cpuIOPS), modelled, nil
	}
}

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-9*math.Max(math.Abs(a), math.Abs(b)) }

// TestChooseScale: the scale is chosen by measuring, not guessed (issue
// 17): CPUs that deliver 3400 IOPS with the drives out of the way (scale
// 1, 20M modelled) put the model at half of that at scale 0.000085; a
// machine that keeps up keeps the site's ceiling; CPUs slower than the
// model at the floor end there, CPU-bound; CPUs between half and all of
// it end at the floor with a thinner margin; a failed measurement is an
// error.
func TestChooseScale(t *testing.T) {
	ctx := context.Background()
	var calls []float64
	cal, err := chooseScale(ctx, 0.0005, 1e-5, cpuLimited(3400, &calls))
	if err != nil {
		t.Fatal(err)
	}
	if !near(cal.Chosen, 0.000085) || cal.CPUBound || len(cal.Steps) != 1 || !slices.Equal(calls, []float64{1}) {
		t.Fatalf("CPUs at 3400 IOPS: %+v, measured at %v; want 0.000085 chosen from one measurement at scale 1", cal, calls)
	}
	if txt := cal.Text(); !strings.Contains(txt, "Scale 8.5e-05, chosen at start-up") || !strings.Contains(txt, "delivered 3400 IOPS") || !strings.Contains(txt, "1700 IOPS, is 50% of it") {
		t.Errorf("text %q", txt)
	}

	calls = nil
	cal, _ = chooseScale(ctx, 0.0005, 1e-5, cpuLimited(1e9, &calls))
	if cal.Chosen != 0.0005 || cal.CPUBound || !strings.Contains(cal.Text(), "the site's model.scale, the largest allowed") {
		t.Errorf("a machine that keeps up: %+v %q; want the ceiling", cal, cal.Text())
	}

	calls = nil
	cal, _ = chooseScale(ctx, 0.0005, 0.0002, cpuLimited(300, &calls))
	if cal.Chosen != 0.0002 || !cal.CPUBound {
		t.Fatalf("CPUs too slow for the floor: %+v; want the floor 0.0002, CPU-bound", cal)
	}
	if txt := cal.Text(); !strings.Contains(txt, "the floor 0.0002") || !strings.Contains(txt, "4000 IOPS are 1333% of what the CPUs deliver") || !strings.Contains(txt, "CPU-bound, not findings") {
		t.Errorf("CPU-bound text %q", txt)
	}

	if cal, _ := chooseScale(ctx, 0.0001, 0.0002, cpuLimited(1e9, &calls)); cal.Chosen != 0.0002 {
		t.Errorf("a ceiling below the floor: %+v; want the floor", cal)
	}

	cal, _ = chooseScale(ctx, 0.0005, 0.0002, cpuLimited(6000, &calls))
	if cal.Chosen != 0.0002 || cal.CPUBound || !strings.Contains(cal.Text(), "4000 IOPS are 67% of what the CPUs deliver, a thinner margin") {
		t.Errorf("CPUs at 6000 IOPS, the floor's model at 4000: %+v %q; want the floor, not CPU-bound, a thinner margin", cal, cal.Text())
	}

	boom := errors.New("cluster not up")
	if _, err := chooseScale(ctx, 0.0005, 1e-5, func(context.Context, float64) (float64, float64, error) { return 0, 0, boom }); !errors.Is(err, boom) {
		t.Errorf("a failed measurement: %v, want it returned", err)
	}
	if _, err := chooseScale(ctx, 0.0005, 1e-5, func(context.Context, float64) (float64, float64, error) { return 0, 2e7, nil }); err == nil {
		t.Error("nothing achieved: want an error, not a scale of 0")
	}
}

// TestModelFloorAndCapacity: the floor follows member_io_timeout (four
// 1 MiB writes in flight per RAID-5 3+1 array put 1.33 MiB on each member,
// which must drain within half the timeout at 5300 MB/s × scale); the
// modelled random-read capacity of local-5node is 20 drives × 1M IOPS ×
// scale.
func TestModelFloorAndCapacity(t *testing.T) {
	t.Setenv(config.EnvModelScale, "")
	t.Setenv("TIER0_WORK", t.TempDir())
	cfg, err := config.Load("../site-configs/local-5node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	timeout := cfg.Policies.MemberIOTimeout.D().Seconds()
	floor, why := modelFloor(cfg, 4, 1<<20)
	if want := 4.0 * (1 << 20) / 3 / (5300e6 * timeout * 0.5); !near(floor, want) {
		t.Errorf("floor %v, want %v (member_io_timeout %vs)", floor, want, timeout)
	}
	if !strings.Contains(why, "member_io_timeout") || !strings.Contains(why, "1.33 MiB") {
		t.Errorf("floor's derivation %q", why)
	}
	cfg.Policies.MemberIOTimeout *= 2
	if f2, _ := modelFloor(cfg, 4, 1<<20); !near(f2, floor/2) {
		t.Errorf("twice the timeout: floor %v, want %v", f2, floor/2)
	}
	if got := randReadCapacity(cfg, 0.0005); !near(got, 10000) {
		t.Errorf("random-read capacity at 0.0005: %v, want 10000", got)
	}
}

// TestCalibrateSetsTheScaleForTheRun: the chosen scale is the run's: the
// results' model, the raw bench's drives and the tier0d processes started
// afterwards all use it; a scale given with --model-scale is kept and
// nothing is measured.
func TestCalibrateSetsTheScaleForTheRun(t *testing.T) {
	t.Setenv(config.EnvModelScale, "")
	work := t.TempDir()
	t.Setenv("TIER0_WORK", work)
	cfg, err := config.Load("../site-configs/local-5node.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var calls []float64
	r := &runner{o: Options{Local: true, Out: io.Discard}, t: timingsFor(false), cfg: cfg, ctx: context.Background(), work: work,
		res: bench.NewResults("r", "local-5node", time.Unix(0, 0), bench.Environment{}), measureScale: cpuLimited(5000, &calls)}
	r.lc = newLocalCluster(cfg, "/bin/false", "site.yaml", work, discardLog())
	r.res.Run.Model = modelInfo(cfg, true)
	r.calibrate()
	m := r.res.Run.Model
	if m == nil || m.Calibration == nil || !near(m.Scale, 0.000125) || m.Calibration.Chosen != m.Scale || !near(m.Drive.ReadIOPS, 125) {
		t.Fatalf("results' model after calibrating %+v (calibration %+v); want scale 0.000125, 125 read IOPS per drive", m, m.Calibration)
	}
	if m.Calibration.Floor <= 0 || m.Calibration.Floor > m.Scale || m.Calibration.Workload == "" {
		t.Errorf("calibration record %+v", m.Calibration)
	}
	want := config.EnvModelScale + "=" + strconv.FormatFloat(m.Scale, 'g', -1, 64)
	if got := config.EnvModelScale + "=" + os.Getenv(config.EnvModelScale); got != want {
		t.Errorf("%s after calibrating, want %s", got, want)
	}
	if env := r.lc.Env(); !slices.Contains(env, want) {
		t.Errorf("the tier0d environment lacks %s: %v", want, env[len(env)-1])
	}
	devs, err := openDrives(cfg, discardLog())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devs {
		if sh := d.dev.(interface{ Model() blockdev.Model }); !near(sh.Model().ReadIOPS, 125) {
			t.Errorf("raw bench drive %s at %v read IOPS, want the chosen scale's 125", d.name, sh.Model().ReadIOPS)
		}
		d.dev.Close()
	}

	calls = nil
	t.Setenv(config.EnvModelScale, "0.0003")
	r.scaleGiven = true
	r.res.Run.Model = modelInfo(cfg, true)
	r.calibrate()
	if len(calls) != 0 || r.res.Run.Model.Scale != 0.0003 || !r.res.Run.Model.Calibration.Given || !strings.Contains(r.res.Run.Model.Calibration.Text(), "not calibrated") {
		t.Errorf("a given scale: measured at %v, model %+v; want 0.0003 kept, not calibrated", calls, r.res.Run.Model)
	}
}
