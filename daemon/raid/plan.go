package raid

import "fmt"

// Plan returns the geometry that Create would give an array of members
// members of memberSize bytes each with block size blockSize, without
// touching any device. The daemon uses it to size an array's frontend
// namespace on every node before the array is first assembled.
func Plan(cfg Config, members int, memberSize int64, blockSize int) (Geometry, error) {
	if cfg.ChunkSize == 0 {
		cfg.ChunkSize = 64 << 10
	}
	if cfg.BitmapRegion == 0 {
		cfg.BitmapRegion = 4 << 20
	}
	if cfg.LogSlots == 0 {
		cfg.LogSlots = 32
	}
	slots := cfg.LogSlots
	if cfg.DisableLog {
		slots = 0
	}
	if blockSize <= 0 || memberSize <= 0 || members <= 0 {
		return Geometry{}, fmt.Errorf("plan: %d members of %d bytes, block size %d: all must be positive: %w", members, memberSize, blockSize, ErrInvalidConfig)
	}
	g, _, err := layout(cfg.Level, members, int64(cfg.ChunkSize), blockSize, memberSize, cfg.BitmapRegion, slots)
	return g, err
}
