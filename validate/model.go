package validate

import (
	"tier0/bench"
	"tier0/daemon/config"
)

// modelInfo describes the site's performance model for the results: nil
// when no drive has one, or when the cluster is not local (a real
// cluster's tier0d may run another site file; its drives perform as they
// do).
func modelInfo(cfg *config.Config, local bool) *bench.ModelInfo {
	if !local {
		return nil
	}
	for _, n := range cfg.Nodes {
		for _, d := range n.Drives {
			f, link, src, ok := cfg.DriveModelOf(d.Name)
			if !ok {
				continue
			}
			return &bench.ModelInfo{
				Profile: d.Model.Profile, Source: src, Scale: cfg.ModelScale(),
				Drive: bench.DriveFigures{ReadBytesPerS: f.ReadBytesPerS, WriteBytesPerS: f.WriteBytesPerS, ReadIOPS: f.ReadIOPS, WriteIOPS: f.WriteIOPS,
					ReadLatNs: f.ReadLatency.Nanoseconds(), WriteLatNs: f.WriteLatency.Nanoseconds()},
				LinkBytesPerS: link,
				How:           "tier0d opens every drive through the model (bandwidth, IOPS and a latency floor per direction), and so does the raw bench; each node's link is charged for its drives' bytes and for the bytes its frontend serves",
			}
		}
	}
	return nil
}
