package raid

// Writes while the array has no redundancy left.
//
// A member's drive may keep completed writes in a volatile cache until a
// flush; its node's power cut loses them. With the array optimal that
// costs at most one member's recent writes, which the others' parity
// holds: the member is missing when it returns, and catches up the
// stripes it held unflushed when it left (markFailedLocked). With no
// redundancy left (RAID-5 with one member out, RAID-6 with two, a mirror
// with one copy) the survivors' caches hold the only copy: a power cut
// of one of them loses acknowledged writes that nothing can rebuild
// (docs/RELIABILITY.md known problem 8). So from the moment a member is
// lost (a.losses) the survivors are flushed before anything more is
// acknowledged (failAs, and a write that saw a member lost while it ran),
// and every later write is durable before its acknowledgement (FUA on
// every member write) until the array is optimal again. Only a degraded
// array pays (docs/RAID.md "Durability").

// exposed reports whether the array has lost its last redundancy: one
// more member lost loses data, so a survivor's volatile cache is the only
// copy of what it holds.
func (a *Array) exposed() bool {
	red := a.geo.Level.redundancy(a.geo.Members)
	return red > 0 && a.notActive() >= red && !a.volatileExposed
}

// lostDuring makes a write issued without FUA durable before its ack when
// a member was lost while it ran (a.losses moved from lost) and the array
// is exposed now: the loss's own flush (failAs) may have run before the
// write completed.
func (a *Array) lostDuring(lost uint64) error {
	if a.losses.Load() != lost && a.exposed() {
		return a.flushMembers()
	}
	return nil
}
