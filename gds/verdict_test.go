package gds

import (
	"encoding/json"
	"strings"
	"testing"
)

func goodEvidence() Evidence {
	return Evidence{
		Ops: 100, BytesRead: 100 << 20,
		NvfsBefore: ReadCounters{N: 50, OK: 50, Present: true}, NvfsAfter: ReadCounters{N: 150, OK: 150, Present: true},
		CufileSource: "stats API (cuFileGetStatsL3)", CufileReads: 100, CufileNvfs: 100, CufileHasNvfs: true,
	}
}

func TestJudge(t *testing.T) {
	for _, c := range []struct {
		name   string
		mod    func(e *Evidence)
		proven bool
		want   string // in Reason
		posix  int64
	}{
		{"all direct", func(e *Evidence) {}, true, "", 0},
		{"more nvfs than ops is fine (split I/O, other processes)", func(e *Evidence) { e.NvfsAfter.N = 400 }, true, "", 0},
		{"nvfs short", func(e *Evidence) { e.NvfsAfter.N = 140; e.CufileSource = "" }, false, "nvidia-fs counted 90 reads for 100 operations: 10 did not take the direct path", 10},
		{"nvfs errors", func(e *Evidence) { e.NvfsAfter.Err = 2 }, false, "nvidia-fs counted 2 read errors", 0},
		{"posix", func(e *Evidence) { e.CufilePosix = 3; e.CufileNvfs = 97 }, false, "cuFile served 3 of 100 reads through POSIX", 3},
		{"no kernel counters", func(e *Evidence) {
			e.NvfsAfter.Present = false
			e.NvfsNote = "rw_stats_enabled is 0 and could not be set: permission denied"
		}, false, "nvidia-fs read counters not available (rw_stats_enabled is 0 and could not be set: permission denied)", 0},
		{"compat notice", func(e *Evidence) {
			e.Log.Compat = []LogLine{{Message: "running in compatible mode"}}
		}, false, `cufile.log has 1 compat-mode notices, first: "running in compatible mode"`, 0},
		{"failed reads", func(e *Evidence) { e.Failed = 4; e.FirstError = "cuFileRead: error 5008" }, false, "4 of 100 cuFileRead calls failed or came back short (first: cuFileRead: error 5008)", 0},
		{"data mismatch", func(e *Evidence) { e.DataMismatch = 1 }, false, "1 GPU buffers differ", 0},
		{"no ops", func(e *Evidence) { e.Ops = 0; e.NvfsAfter.N = 50; e.CufileReads = 0; e.CufileNvfs = 0 }, false, "no read was issued", 0},
		{"setup error only", func(e *Evidence) { e.SetupError = "open /x with O_DIRECT: invalid argument" }, false, "open /x with O_DIRECT: invalid argument", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := goodEvidence()
			c.mod(&e)
			v := Judge(e)
			if v.Proven != c.proven || !v.Available {
				t.Fatalf("proven = %v, want %v: %s", v.Proven, c.proven, v.Summary())
			}
			if c.want != "" && !strings.Contains(v.Reason, c.want) {
				t.Errorf("reason %q\nlacks %q", v.Reason, c.want)
			}
			if v.PosixFallbacks != c.posix {
				t.Errorf("posix fallbacks = %d, want %d", v.PosixFallbacks, c.posix)
			}
			if c.proven && v.ExitCode() != ExitProven || !c.proven && v.ExitCode() != ExitProofFailed {
				t.Errorf("exit code = %d", v.ExitCode())
			}
		})
	}
}

func TestVerdictSummaryAndJSON(t *testing.T) {
	v := Judge(Evidence{Ops: 124012, NvfsBefore: ReadCounters{Present: true}, NvfsAfter: ReadCounters{N: 124012, OK: 124012, Present: true}})
	v.SetThroughput(22.1, 18.3)
	if got, want := v.Summary(), "proven: 124012 operations, 124012 through nvfs, 0 POSIX fallbacks; GPU_DIRECT 22.10 GiB/s vs CPU_ONLY 18.30 GiB/s (+21%)"; got != want {
		t.Errorf("summary = %q\nwant      %q", got, want)
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	json.Unmarshal(b, &back)
	for _, k := range []string{"available", "reason", "ops", "nvfs_ops", "posix_fallbacks", "gpu_direct_gib_s", "cpu_only_gib_s", "gain"} {
		if _, ok := back[k]; !ok && k != "reason" {
			t.Errorf("JSON lacks %q: %s", k, b)
		}
	}
	na := NotAvailable(CauseNoCUDA, "no libcuda: x")
	if na.Summary() != "not available on this host: no libcuda: x" || na.ExitCode() != ExitNotAvailable {
		t.Errorf("not available: %q %d", na.Summary(), na.ExitCode())
	}
}

func TestCufileConfig(t *testing.T) {
	base := []byte(`{
	// NVIDIA's file has comments
	"logging": { "dir": "/var/log", "level": "ERROR" },
	"properties": {
		"max_direct_io_size_kb" : 16384, /* inline */
		"allow_compat_mode": true,
	},
	"fs": { "generic": { "posix_unaligned_writes" : false } },
	"url": "http://example//not-a-comment"
}`)
	out, err := CufileConfig(base, "/tmp/w", false)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]map[string]any
	var all map[string]json.RawMessage
	if err := json.Unmarshal(out, &all); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	delete(all, "url")
	b, _ := json.Marshal(all)
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if m["properties"]["allow_compat_mode"] != false || m["properties"]["max_direct_io_size_kb"] != 16384.0 {
		t.Errorf("properties = %v", m["properties"])
	}
	if m["profile"]["cufile_stats"] != 3.0 || m["logging"]["dir"] != "/tmp/w" || m["logging"]["level"] != "INFO" {
		t.Errorf("profile %v logging %v", m["profile"], m["logging"])
	}
	if m["fs"] == nil || !strings.Contains(string(out), "http://example//not-a-comment") {
		t.Errorf("site settings lost: %s", out)
	}
	if _, err := CufileConfig([]byte("{ broken"), "/tmp", true); err == nil {
		t.Error("broken base parsed without error")
	}
	out, _ = CufileConfig(nil, "/tmp/w", true)
	if !strings.Contains(string(out), `"allow_compat_mode": true`) {
		t.Errorf("minimal config = %s", out)
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{"4096": 4096, "1M": 1 << 20, "1MiB": 1 << 20, "10g": 10 << 30, "4k": 4096, "2T": 2 << 40, "512KB": 512 << 10} {
		if got, err := ParseSize(in); err != nil || got != want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "M", "1.5G", "-1", "x"} {
		if _, err := ParseSize(bad); err == nil {
			t.Errorf("ParseSize(%q): no error", bad)
		}
	}
}
