package raid

import "time"

// Pacing of background work by the foreground's latency (Policy.Adaptive).
// While foreground requests run, each rebuild or resync step (a run of
// stripes) is followed by a pause, and the foreground's mean request time
// is measured in both: t_run while the step ran, t_idle while it paused.
// At a fixed queue depth the foreground's throughput goes as 1/latency,
// so over a step of length R and a pause of length S it keeps
//
//	(S + R·t_idle/t_run) / (S + R)
//
// of its throughput; the pause is chosen so that this is paceKeep:
// S = R·(paceKeep − r)/(1 − paceKeep), r = t_idle/t_run. A step that does
// not slow the foreground down is not paused at all, so background work
// runs at the members' full speed on members with bandwidth to spare,
// and yields as much as it costs on members without. With no foreground
// requests there is no pause.

// paceKeep is the foreground throughput fraction the pacing keeps.
const paceKeep = 0.8

// paceMax bounds one pause. The formula itself pauses at most
// paceKeep/(1−paceKeep) = 4 steps' time, so background work always
// advances; the bound only keeps a very long step from pausing for long.
const paceMax = 2 * time.Second

func (a *Array) fgStart() time.Time {
	if !a.pol.Adaptive {
		return time.Time{}
	}
	return time.Now()
}

func (a *Array) fgDone(t0 time.Time) {
	a.fgEnd()
	if !t0.IsZero() {
		a.fgLatSum.Add(int64(time.Since(t0)))
		a.fgLatN.Add(1)
	}
}

// pacer is one background pass's pacing state.
type pacer struct {
	sum, n  int64     // fgLatSum/fgLatN at the last sample
	runFrom time.Time // end of the last pause
	idle    float64   // the foreground's mean time during pauses, ns (EWMA; 0 unknown)
	slept   time.Duration
}

// sample returns the foreground's mean request time (ns) since the last
// sample and how many requests ended meanwhile.
func (p *pacer) sample(a *Array) (float64, int64) {
	s, n := a.fgLatSum.Load(), a.fgLatN.Load()
	ds, dn := s-p.sum, n-p.n
	p.sum, p.n = s, n
	if dn <= 0 {
		return 0, 0
	}
	return float64(ds) / float64(dn), dn
}

// pause is called after a step; it sleeps as the foreground needs.
func (p *pacer) pause(a *Array) {
	now := a.clock.Now()
	if p.runFrom.IsZero() {
		p.runFrom = now
	}
	run := now.Sub(p.runFrom)
	busy, n := p.sample(a)
	if n == 0 && a.fgInflight.Load() == 0 {
		p.runFrom = now
		return // no foreground: full speed
	}
	var d time.Duration
	switch {
	case p.idle == 0 || busy == 0:
		d = run // not measured yet: pause as long as the step took
	default:
		r := p.idle / busy
		if r < paceKeep {
			d = time.Duration(float64(run) * (paceKeep - r) / (1 - paceKeep))
		}
	}
	d = min(d, paceMax)
	if d > 0 {
		// The first half of the pause lets the requests queued behind
		// the step end; the second half measures the foreground alone.
		a.clock.Sleep(d / 2)
		p.sample(a)
		a.clock.Sleep(d - d/2)
		p.slept += d
		if idle, n := p.sample(a); n > 0 {
			if p.idle == 0 {
				p.idle = idle
			} else {
				p.idle += (idle - p.idle) / 4
			}
		}
	}
	p.runFrom = a.clock.Now()
}
