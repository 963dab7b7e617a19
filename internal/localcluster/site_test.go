package localcluster

import "testing"

func TestShiftPorts(t *testing.T) {
	in := "backend:  {port: 24420}\n    etcd:     {client_port: 22379, peer_port: 22380}\n"
	want := "backend:  {port: 24520}\n    etcd:     {client_port: 22479, peer_port: 22480}\n"
	if got := ShiftPorts(in, 100); got != want {
		t.Fatalf("ShiftPorts:\n%s\nwant\n%s", got, want)
	}
}
