package cluster

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

var rewrite = flag.Bool("rewrite", false, "regenerate the expected output in testdata/*.txt")

// block is one transcript step: a command line, "----", the expected
// output up to a blank line. Lines starting with # between blocks are
// comments and are kept on rewrite.
type block struct {
	comments []string
	line     int
	cmd      string
	want     string
}

func parseTranscript(text string) ([]block, error) {
	lines := strings.Split(text, "\n")
	var blocks []block
	var comments []string
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		switch {
		case strings.TrimSpace(l) == "":
			continue
		case strings.HasPrefix(l, "#"):
			comments = append(comments, l)
			continue
		}
		b := block{comments: comments, line: i + 1, cmd: strings.TrimSpace(l)}
		comments = nil
		i++
		if i >= len(lines) || lines[i] != "----" {
			return nil, fmt.Errorf("line %d: command %q not followed by ----", b.line, b.cmd)
		}
		var want []string
		for i++; i < len(lines) && lines[i] != ""; i++ {
			want = append(want, lines[i])
		}
		b.want = strings.Join(want, "\n")
		blocks = append(blocks, b)
	}
	return blocks, nil
}

func configFrom(args []string) (Config, error) {
	cfg := Config{}
	for _, a := range args {
		k, v, _ := strings.Cut(a, "=")
		n, _ := strconv.ParseInt(v, 10, 64)
		switch k {
		case "lease":
			cfg.LeaseTicks = n
		case "selffence":
			cfg.SelfFenceTicks = n
		case "safety":
			cfg.SafetyTicks = n
		case "release-timeout":
			cfg.ReleaseTimeoutTicks = n
		case "failback":
			cfg.Failback = FailbackPolicy(v)
		default:
			return cfg, fmt.Errorf("config: unknown key %q", k)
		}
	}
	return cfg, nil
}

func runTranscript(t *testing.T, path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := parseTranscript(string(data))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var s *sim
	var out strings.Builder
	for _, b := range blocks {
		fields := strings.Fields(b.cmd)
		var got string
		if fields[0] == "config" {
			cfg, err := configFrom(fields[1:])
			if err == nil {
				s, err = newSim(cfg)
			}
			got = "ok"
			if err != nil {
				got = "error: " + err.Error()
			}
		} else {
			if s == nil {
				t.Fatalf("%s:%d: first command must be config", path, b.line)
			}
			got, err = s.run(fields[0], fields[1:])
			if err != nil {
				t.Fatalf("%s:%d: %s: %v", path, b.line, b.cmd, err)
			}
		}
		for _, c := range b.comments {
			out.WriteString(c + "\n")
		}
		fmt.Fprintf(&out, "%s\n----\n%s\n\n", b.cmd, got)
		if !*rewrite && got != b.want {
			t.Errorf("%s:%d: %s\n--- want:\n%s\n--- got:\n%s", path, b.line, b.cmd, b.want, got)
		}
	}
	if s != nil {
		for _, v := range s.violations {
			t.Errorf("%s: %s", path, v)
		}
	}
	if *rewrite {
		if err := os.WriteFile(path, []byte(strings.TrimRight(out.String(), "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestTranscripts(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no transcripts in testdata: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) { runTranscript(t, f) })
	}
}
