package gds

import (
	"errors"
	"strconv"
)

func itoa(i int) string               { return strconv.Itoa(i) }
func errorsIs(err, target error) bool { return errors.Is(err, target) }
