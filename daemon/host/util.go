package host

import "github.com/google/uuid"

func randomUUID() [16]byte { return uuid.New() }

func uuidString(id [16]byte) string { return uuid.UUID(id).String() }
