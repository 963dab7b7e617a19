package main

import (
	"bytes"
	"strings"
	"testing"

	"tier0/daemon/nvme"
)

func TestGenDHCHAPKey(t *testing.T) {
	var out bytes.Buffer
	root := newRootCmd()
	root.SetOut(&out)
	root.SetArgs([]string{"fabric", "gen-dhchap-key", "--key-length", "48", "--hash", "sha384"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	s := strings.TrimSpace(out.String())
	if !strings.HasPrefix(s, "DHHC-1:02:") {
		t.Fatalf("secret %q: want the DHHC-1:02: prefix for sha384", s)
	}
	if _, err := nvme.ParseDHCHAPSecret(s); err != nil {
		t.Fatalf("generated secret does not parse: %v", err)
	}
}
