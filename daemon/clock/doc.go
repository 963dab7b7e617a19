// Package clock is tier0's one source of time: the wall clock in
// production, a Fake in tests and in the in-process simulation, where a
// whole cluster's timers advance only when the test says so and a failing
// seed replays the same way.
//
// Every layer that measures or waits (leases, keep-alive, I/O timeouts,
// rebuild pacing, the coordinator's ticks) takes a Clock instead of
// calling package time, so that one Fake drives them all.
package clock
