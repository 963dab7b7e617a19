package reports

import (
	_ "embed"
	"encoding/json"
	"fmt"
)

//go:embed weizmann-5node.json
var weizmannJSON []byte

// Reference is the seed's figures (the xiRAID Opus + Storage Scale
// validation at the Weizmann Institute): 5 nodes x 4 drives, RAID-5 3+1.
type Reference struct {
	Name     string `json:"name"`
	Topology struct {
		Nodes         int    `json:"nodes"`
		DrivesPerNode int    `json:"drives_per_node"`
		DriveModel    string `json:"drive_model"`
		Network       string `json:"network"`
		Arrays        int    `json:"arrays"`
		ArrayLevel    string `json:"array_level"`
		DataMembers   int    `json:"array_data_members"`
		ParityMembers int    `json:"array_parity_members"`
		Filesystem    string `json:"filesystem"`
	} `json:"topology"`
	Healthy struct {
		SeqReadGiBs struct {
			RawBlock   float64 `json:"raw_block"`
			Filesystem float64 `json:"filesystem"`
		} `json:"seq_read_gib_s"`
		SeqWriteGiBs struct {
			Filesystem           float64 `json:"filesystem"`
			FilesystemOverRawBlk float64 `json:"filesystem_over_raw_block"`
		} `json:"seq_write_gib_s"`
		RandRead4KIOPS struct {
			Filesystem float64 `json:"filesystem"`
		} `json:"rand_read_4k_iops"`
		RandWrite4KIOPS struct {
			Filesystem float64 `json:"filesystem"`
		} `json:"rand_write_4k_iops"`
	} `json:"healthy"`
	OneNodeLost struct {
		Retained struct {
			Sequential float64    `json:"sequential"`
			Random     float64    `json:"random"`
			Range      [2]float64 `json:"overall_range"`
		} `json:"retained_fraction"`
		RandomLatencyIncrease     float64    `json:"random_latency_increase_fraction"`
		SequentialLatencyIncrease [2]float64 `json:"sequential_latency_increase_fraction"`
		FailedArrayBehaviour      string     `json:"failed_array_behaviour"`
		DataLoss                  string     `json:"data_loss"`
		RebuildAfterRestore       string     `json:"rebuild_after_restore"`
	} `json:"one_node_lost"`
	GDS struct {
		AggregateReadGiBs float64 `json:"aggregate_read_gib_s_5_nodes_1_gpu_each"`
		SingleGPU         struct {
			GPUDirectGiBs float64 `json:"gpu_direct_gib_s"`
			CPUOnlyGiBs   float64 `json:"cpu_only_gib_s"`
			Gain          float64 `json:"gain_fraction"`
		} `json:"single_gpu"`
		VerifiedOps    int64 `json:"verified_ops"`
		PosixFallbacks int64 `json:"posix_fallbacks"`
	} `json:"gpudirect_storage"`
}

// Seed returns the embedded seed reference.
func Seed() (*Reference, error) {
	var r Reference
	if err := json.Unmarshal(weizmannJSON, &r); err != nil {
		return nil, fmt.Errorf("embedded weizmann-5node.json: %w", err)
	}
	return &r, nil
}
