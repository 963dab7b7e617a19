// Package gobuild builds this module's commands for the tests and harnesses
// that run them as processes of their own (local clusters, fault campaigns,
// the end-to-end validation): one helper, so that every one of them runs
// binaries built the same way from the tree under test.
package gobuild
