package target

import (
	"io"
	"net"
	"testing"
	"time"
)

func dialNoHandshake(t testing.TB, addr string) net.Conn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	return nc
}

// readAllTimeout reads until EOF or 10 s.
func readAllTimeout(nc net.Conn) ([]byte, error) {
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	return io.ReadAll(nc)
}
