//go:build !cgo || !linux

package gds

import "context"

// Validate cannot run without the cgo bindings: it returns the "not
// available" verdict that says so.
func Validate(ctx context.Context, o Options) (Verdict, error) {
	if err := o.setDefaults(); err != nil {
		return Verdict{}, err
	}
	return NotAvailable(CauseNotBuilt, "this tier0 binary was built without cgo, so it has no cuFile bindings: rebuild with CGO_ENABLED=1 and a C compiler"), nil
}
