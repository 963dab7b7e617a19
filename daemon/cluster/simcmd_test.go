package cluster

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// The sim's command language, as the transcripts (testdata/*.txt) use it.
// A command is a name and arguments, positional ones and key=value ones;
// an argument "quiet" (or quiet=true) prints counts instead of actions.

// simArgs are a command's arguments.
type simArgs struct {
	pos []string
	kv  map[string]string
}

func parseSimArgs(args []string) simArgs {
	c := simArgs{kv: map[string]string{}}
	for _, a := range args {
		if k, v, ok := strings.Cut(a, "="); ok {
			c.kv[k] = v
		} else {
			c.pos = append(c.pos, a)
		}
	}
	return c
}

// int is the value of key k, or def when it is absent or not a number.
func (c simArgs) int(k string, def int) int {
	if v, ok := c.kv[k]; ok {
		n, err := strconv.Atoi(v)
		if err == nil {
			return n
		}
	}
	return def
}

// usageError: the sim cannot run the command (unknown command or
// array). An event the machine refuses is not one: the transcript shows
// it as "error: ...".
type usageError struct{ error }

// run executes one command and returns what it printed ("ok" for
// nothing): the actions decided, with the tick, and any violation.
func (s *sim) run(cmd string, args []string) (string, error) {
	s.out.Reset()
	c := parseSimArgs(args)
	s.quiet = c.kv["quiet"] == "true" || slices.Contains(c.pos, "quiet")
	err := s.exec(cmd, c)
	var ue usageError
	if errors.As(err, &ue) {
		return "", ue.error
	}
	if err != nil {
		fmt.Fprintf(s.out, "error: %v\n", err)
	}
	s.checkOwners()
	if s.quiet {
		s.flushCounts()
	}
	out := strings.TrimRight(s.out.String(), "\n")
	if out == "" {
		out = "ok"
	}
	return out, nil
}

// exec hands the command to the group that knows it.
func (s *sim) exec(cmd string, c simArgs) error {
	for _, group := range []func(string, simArgs) (bool, error){s.execSetup, s.execFault, s.execOperator, s.execRepair} {
		if ok, err := group(cmd, c); ok {
			return err
		}
	}
	switch cmd {
	case "status":
		fmt.Fprintln(s.out, s.status())
	case "summary":
		fmt.Fprintln(s.out, s.summary())
	default:
		return usageError{fmt.Errorf("unknown command %q", cmd)}
	}
	return nil
}

// execSetup: build the cluster and let time pass.
func (s *sim) execSetup(cmd string, c simArgs) (bool, error) {
	pos, kv := c.pos, c.kv
	var err error
	switch cmd {
	case "add-node":
		var drives []string
		if d := kv["drives"]; d != "" {
			drives = strings.Split(d, ",")
		} else {
			for i := 1; i <= 4; i++ {
				drives = append(drives, fmt.Sprintf("%s%d", pos[0], i))
			}
		}
		s.rack[pos[0]] = kv["rack"]
		err = s.step(NodeJoined{Node: pos[0], Domain: kv["rack"], Drives: drives})
	case "add-array":
		var lvl Level
		if lvl, err = ParseLevel(kv["level"]); err != nil {
			break
		}
		var ms []MemberSpec
		for _, d := range strings.Split(kv["members"], ",") {
			ms = append(ms, MemberSpec{Drive: d})
		}
		err = s.step(ArrayDefined{Name: pos[0], Level: lvl, Home: kv["home"], Members: ms, Failback: FailbackPolicy(kv["failback"])})
	case "gen-cluster":
		lvl, _ := ParseLevel(kv["level"])
		err = s.genCluster(c.int("nodes", 64), c.int("racks", 8), c.int("drives", 4), c.int("width", 4), lvl, kv["domains"])
	case "tick":
		n := 1
		if len(pos) > 0 && pos[0] != "quiet" {
			n, _ = strconv.Atoi(pos[0])
		}
		s.tick(n)
	default:
		return false, nil
	}
	return true, err
}

// execFault: break nodes, the network, fences, repairs, drives, arrays,
// and mend them.
func (s *sim) execFault(cmd string, c simArgs) (bool, error) {
	pos := c.pos
	var err error
	switch cmd {
	case "kill":
		s.kill(pos[0])
	case "kill-rack":
		for _, id := range s.m.nodeOrder {
			if s.rack[id] == pos[0] {
				s.kill(id)
			}
		}
	case "partition":
		s.partitioned[pos[0]] = true
	case "return", "heal":
		err = s.revive(pos[0])
	case "expire": // the store expired the node's lease (the coordinator's view; no LeaseTicks needed)
		err = s.step(LeaseExpired{Node: pos[0]})
	case "report-returned": // the node's daemon reports it serves nothing (it fenced itself and re-registered)
		err = s.step(NodeReturned{Node: pos[0]})
	case "suspect":
		err = s.step(PartitionSuspected{Node: pos[0]})
	case "unsuspect":
		err = s.step(PartitionCleared{Node: pos[0]})
	case "fail-next-fence":
		s.failFence[pos[0]] = true
	case "fail-fences": // fail-fences NODE [n=K]: NODE fails its next K fences (all when n is absent)
		s.nodeFails[pos[0]] = c.int("n", -1)
	case "heal-fences":
		delete(s.nodeFails, pos[0])
	case "refuse-repairs": // refuse-repairs ARRAY REASON...: its owner refuses every Resync/Rebuild
		s.refuse[pos[0]] = strings.Join(pos[1:], " ")
	case "allow-repairs":
		delete(s.refuse, pos[0])
	case "array-failed": // array-failed ARRAY REASON...: its owner's RAID failed; it stops serving
		a, ok := s.m.arrays[pos[0]]
		if !ok {
			return true, usageError{fmt.Errorf("array %q unknown", pos[0])}
		}
		delete(s.acting[a.name], a.owner)
		err = s.step(ArrayFailed{Array: a.name, Node: a.owner, Epoch: a.epoch, Reason: strings.Join(pos[1:], " ")})
	case "fail-drive":
		err = s.step(MemberFailed{Array: pos[0], Member: pos[1]})
	case "replace-drive":
		err = s.step(DriveReplaced{Drive: pos[0]})
	default:
		return false, nil
	}
	return true, err
}

// execOperator: an operator's requests.
func (s *sim) execOperator(cmd string, c simArgs) (bool, error) {
	var err error
	switch cmd {
	case "drain":
		err = s.step(DrainRequested{Node: c.pos[0]})
	case "undrain":
		err = s.step(UndrainRequested{Node: c.pos[0]})
	case "failback":
		err = s.step(FailbackRequested{Array: c.pos[0]})
	default:
		return false, nil
	}
	return true, err
}

// execRepair: the owner reports the progress and end of repairs.
func (s *sim) execRepair(cmd string, c simArgs) (bool, error) {
	pos := c.pos
	var err error
	switch cmd {
	case "rebuild-progress":
		err = s.step(RebuildProgress{Array: pos[0], Member: pos[1], Percent: c.int("pct", 0), Epoch: s.repairs[pos[0]+"/"+pos[1]]})
	case "resync-done", "rebuild-done":
		a, ok := s.m.Array(pos[0])
		if !ok {
			return true, usageError{fmt.Errorf("array %q unknown", pos[0])}
		}
		for _, mb := range a.Members {
			if len(pos) > 1 && mb.Drive != pos[1] {
				continue
			}
			ep := s.repairs[a.Name+"/"+mb.Drive]
			if mb.State == MemberResyncing && cmd == "resync-done" {
				err = s.step(ResyncDone{Array: a.Name, Member: mb.Drive, Epoch: ep})
			} else if mb.State == MemberRebuilding || mb.State == MemberResyncing {
				err = s.step(RebuildDone{Array: a.Name, Member: mb.Drive, Epoch: ep})
			}
		}
	case "resync-all":
		for _, a := range s.m.Arrays() {
			for _, mb := range a.Members {
				if mb.State == MemberResyncing || mb.State == MemberRebuilding {
					if err = s.step(RebuildDone{Array: a.Name, Member: mb.Drive, Epoch: s.repairs[a.Name+"/"+mb.Drive]}); err != nil {
						break
					}
				}
			}
		}
	default:
		return false, nil
	}
	return true, err
}
