package target

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"
)

// Config.ConnectTimeout, not the package default, bounds a connection
// that never connects: with the default at an hour and the target's at
// one second, a silent host is disconnected well inside the read's 30 s.
func TestConfigConnectTimeout(t *testing.T) {
	old := connectTimeout
	connectTimeout = time.Hour
	t.Cleanup(func() { connectTimeout = old })
	_, addr := newTarget(t, Config{ConnectTimeout: time.Second}, nil)
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	_ = nc.SetReadDeadline(time.Now().Add(30 * time.Second))
	n, err := nc.Read(make([]byte, 1))
	if errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a host that sent nothing was still connected after 30 s: Config.ConnectTimeout (1 s) not applied")
	}
	if err == nil {
		t.Fatalf("read %d bytes from a target the host sent nothing to", n)
	}
}
