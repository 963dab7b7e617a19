//go:build !cgo || !linux

package gds

import (
	"context"
	"testing"
)

func TestValidateWithoutCgo(t *testing.T) {
	v, err := Validate(context.Background(), Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if v.Available || v.Cause != CauseNotBuilt || v.ExitCode() != ExitNotAvailable {
		t.Errorf("verdict = %+v", v)
	}
}
