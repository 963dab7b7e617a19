package vm

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// TestGuestRoundTrip boots one guest and checks the whole harness contract:
// the script's exit code comes back, files flow both ways through the share,
// a guest port is reachable through HostFwd and the guest reaches the host's
// loopback at 10.0.2.2.
func TestGuestRoundTrip(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	got := make(chan string, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(time.Minute))
		line, _ := bufio.NewReader(c).ReadString('\n')
		got <- strings.TrimSpace(line)
	}()
	port := l.Addr().(*net.TCPAddr).Port
	script := fmt.Sprintf(`
echo "kernel $(uname -r)"
cat /harness/data/in.txt
echo "from-guest" | nc 10.0.2.2 %d
echo hello-host > /tmp/msg
nc -l -p 7000 < /tmp/msg &
sleep 0.5
echo ready > /harness/out/ready
n=0; while [ ! -e /harness/go ] && [ $n -lt 600 ]; do sleep 0.1; n=$((n+1)); done
echo "go=$(cat /harness/go)"
`+ServeLoop+`
exit 7
`, port)
	g := Start(t, Options{
		Script:  script,
		Files:   map[string][]byte{"data/in.txt": []byte("input-file-ok\n")},
		HostFwd: []int{7000},
		Timeout: 3 * time.Minute,
	})
	if _, err := g.WaitFile("ready", 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", g.HostPort(7000)), 10*time.Second)
	if err != nil {
		t.Fatalf("dial forwarded guest port 7000 at host port %d: %v", g.HostPort(7000), err)
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	b, _ := io.ReadAll(c)
	c.Close()
	if strings.TrimSpace(string(b)) != "hello-host" {
		t.Errorf("read %q from the forwarded guest port, want hello-host", b)
	}
	if err := g.Signal("go", []byte("yes")); err != nil {
		t.Fatal(err)
	}
	out, rc, err := g.Exec("echo exec-out; exit 4", time.Minute)
	if err != nil || rc != 4 || strings.TrimSpace(out) != "exec-out" {
		t.Errorf("Exec = %q, %d, %v; want exec-out, 4, nil", out, rc, err)
	}
	if out := g.MustExec("uname -m", time.Minute); strings.TrimSpace(out) != "x86_64" {
		t.Errorf("MustExec(uname -m) = %q", out)
	}
	g.Stop()
	res := g.Wait()
	if res.RC != 7 {
		t.Errorf("RC = %d, want 7; output:\n%s", res.RC, res.Output)
	}
	for _, want := range []string{"input-file-ok", "go=yes", "kernel 6."} {
		if !strings.Contains(res.Output, want) {
			t.Errorf("guest output lacks %q:\n%s", want, res.Output)
		}
	}
	select {
	case s := <-got:
		if s != "from-guest" {
			t.Errorf("host listener got %q, want from-guest", s)
		}
	default:
		t.Errorf("the guest never reached the host listener at 10.0.2.2:%d", port)
	}
	t.Logf("guest run took %v", res.Wall)
}
