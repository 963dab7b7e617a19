//go:build !cgo || !linux

package cufile

import "fmt"

// Built reports whether this binary carries the cgo bindings.
const Built = false

// CUDA is unavailable in a build without cgo.
type CUDA struct{}

// OpenCUDA always fails with ErrNotBuilt.
func OpenCUDA(path string) (*CUDA, error) {
	return nil, fmt.Errorf("%w (rebuild tier0 with CGO_ENABLED=1 and a C compiler)", ErrNotBuilt)
}

// Lib is unavailable in a build without cgo.
type Lib struct{}

// Open always fails with ErrNotBuilt.
func Open(path string) (*Lib, error) {
	return nil, fmt.Errorf("%w (rebuild tier0 with CGO_ENABLED=1 and a C compiler)", ErrNotBuilt)
}
