// Package reports turns bench results (bench.Results) into a single-file
// HTML report with embedded plots, a Markdown summary and terminal tables,
// and puts them side by side with the seed's published figures
// (weizmann-5node.json, embedded).
package reports
