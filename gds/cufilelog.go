package gds

import (
	"bufio"
	"io"
	"regexp"
	"strconv"
	"strings"
)

// LogLine is one classified cufile.log line.
type LogLine struct {
	PID     int    `json:"pid"`
	Level   string `json:"level"`
	Source  string `json:"source"`
	Message string `json:"message"`
}

// LogScan is what a cufile.log says about the data path.
type LogScan struct {
	Lines int `json:"lines"`
	// Compat: NOTICE/WARN/ERROR lines saying I/O went (or will go) through
	// POSIX compat mode. INFO and DEBUG lines are left out: at those levels
	// cuFile echoes its configuration (allow_compat_mode and the like).
	Compat []LogLine `json:"compat,omitempty"`
	// Errors: ERROR lines (driver not loaded, cuInit failed, libcuda
	// missing...).
	Errors []LogLine `json:"errors,omitempty"`
	// DirectPath counts lines showing the nvfs path ("gds path taken",
	// nvfs_io_submit); they appear only at DEBUG/TRACE log level.
	DirectPath int `json:"direct_path"`
}

var reCufileLog = regexp.MustCompile(`\[pid=(\d+)\s+tid=\d+\]\s+([A-Z]+)\s+(\S+)\s+(.*?)\s*$`)

// ScanCufileLog classifies cufile.log lines. pid > 0 keeps only lines of
// that process (a log file may be shared); pid 0 keeps all.
func ScanCufileLog(r io.Reader, pid int) (LogScan, error) {
	var out LogScan
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		m := reCufileLog.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		p, _ := strconv.Atoi(m[1])
		if pid > 0 && p != pid {
			continue
		}
		out.Lines++
		l := LogLine{PID: p, Level: m[2], Source: m[3], Message: strings.Join(strings.Fields(m[4]), " ")}
		msg := strings.ToLower(l.Message)
		switch {
		case strings.Contains(msg, "gds path taken") || strings.Contains(msg, "nvfs_io_submit"):
			out.DirectPath++
		case l.Level != "INFO" && l.Level != "DEBUG" && l.Level != "TRACE" && isCompatMessage(msg):
			out.Compat = append(out.Compat, l)
		case l.Level == "ERROR":
			out.Errors = append(out.Errors, l)
		}
	}
	return out, sc.Err()
}

func isCompatMessage(msg string) bool {
	return strings.Contains(msg, "compat mode") ||
		strings.Contains(msg, "compatible mode") ||
		strings.Contains(msg, "posix read/write") ||
		strings.Contains(msg, "posix fallback")
}
