package config

import (
	"fmt"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"tier0/daemon/nvme"
)

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)

// hostRE accepts DNS names (a host that is not an IP address).
var hostRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*$`)

type checker struct {
	file  string
	probs []Problem
}

func (k *checker) add(key, format string, args ...any) {
	k.probs = append(k.probs, Problem{File: k.file, Key: key, Msg: fmt.Sprintf(format, args...)})
}

func (c *Config) nodeNames() string {
	var s []string
	for _, n := range c.Nodes {
		s = append(s, n.Name)
	}
	return strings.Join(s, ", ")
}

func isWildcard(h string) bool { return h == "0.0.0.0" || h == "::" || h == "" }

func (k *checker) host(key, h string, advertise bool) {
	if ip := net.ParseIP(h); ip != nil {
		if advertise && ip.IsUnspecified() {
			k.add(key, "%q is a wildcard address, which others cannot connect to; expected the address other nodes and hosts should use", h)
		}
		return
	}
	if !hostRE.MatchString(h) || len(h) > 253 {
		k.add(key, "%q is not an IP address or host name; expected e.g. 10.0.0.1 or node-a.example.org", h)
	}
}

type listener struct {
	key, node, host string
	port            int
}

// validate runs every check, appending to earlier problems, then resolves
// automatic placement when the arrays are otherwise valid. The checks run
// in the order of the file's sections, so problems are reported in it.
func (c *Config) validate(earlier []Problem) error {
	k := &checker{file: c.File, probs: earlier}

	c.checkCluster(k)
	nodeAt, driveNode, listeners := c.checkNodes(k)
	listeners = c.checkControlPlane(k, nodeAt, listeners)
	checkPortClashes(k, listeners)
	arraysOK := c.checkArrays(k, nodeAt, driveNode)
	c.checkVolumes(k) // volumes.go
	c.checkPlacement(k)
	c.checkFabrics(k)
	c.checkPolicies(k)
	c.checkSlurm(k, nodeAt)

	c.validateModel(k) // model.go
	// Automatic placement, once everything it depends on is sound.
	if arraysOK && !hasArrayOrNodeProblem(k.probs) {
		c.resolvePlacement(k)
	}
	if len(k.probs) > 0 {
		return &ValidationError{Problems: k.probs}
	}
	return nil
}

func (c *Config) checkCluster(k *checker) {
	if c.Cluster == "" {
		k.add("cluster", "missing; expected a cluster name such as \"weizmann\"")
	} else if !nameRE.MatchString(c.Cluster) {
		k.add("cluster", "%q has characters other than letters, digits, '-', '_' and '.'; expected a short name such as \"weizmann\"", c.Cluster)
	}
}

// checkNodes checks the nodes, their listeners and drives. It returns the
// index of every validly named node, the node of every drive and the
// listeners whose ports are valid (for the clash check).
func (c *Config) checkNodes(k *checker) (nodeAt map[string]int, driveNode map[string]string, listeners []listener) {
	if len(c.Nodes) == 0 {
		k.add("nodes", "no nodes; expected at least one node with a name, addresses and drives")
	}
	if len(c.Nodes) > MaxNodes {
		k.add("nodes", "%d nodes; expected at most %d: every node's frontend serves every array's NVMe subsystem and hands out controller IDs from its own range of %d, and controller IDs are 16 bits with 0xFFF0-0xFFFF reserved; split the site into clusters of at most %d nodes",
			len(c.Nodes), MaxNodes, CntlIDsPerNode, MaxNodes)
	}
	nodeAt = map[string]int{}
	driveAt := map[string]string{} // drive name -> key of its first definition
	driveNode = map[string]string{}
	for i, n := range c.Nodes {
		key := fmt.Sprintf("nodes[%d]", i)
		switch {
		case n.Name == "":
			k.add(key+".name", "missing; expected a short node name such as \"A\"")
		case !nameRE.MatchString(n.Name):
			k.add(key+".name", "%q has characters other than letters, digits, '-', '_' and '.'", n.Name)
		default:
			if j, dup := nodeAt[n.Name]; dup {
				k.add(key+".name", "duplicate node name %q (also nodes[%d]); expected every node name to be unique", n.Name, j)
			} else {
				nodeAt[n.Name] = i
			}
		}
		if n.Address != "" {
			k.host(key+".address", n.Address, false)
		}
		listeners = checkListeners(k, key, n, listeners)
		checkDrives(k, key, n, driveAt, driveNode)
	}
	return nodeAt, driveNode, listeners
}

// checkListeners checks node n's backend, frontend and API endpoints and
// appends those with a valid port to listeners.
func checkListeners(k *checker, key string, n Node, listeners []listener) []listener {
	for _, ep := range []struct {
		name string
		e    Endpoint
	}{{"backend", n.Backend}, {"frontend", n.Frontend}, {"api", n.API}} {
		ek := key + "." + ep.name
		h := n.hostOf(ep.e)
		if h == "" {
			k.add(ek+".addr", "missing; set %s.address (for every listener) or %s.addr", key, ek)
		} else {
			k.host(ek+".addr", h, false)
			if ep.e.Advertise != "" {
				k.host(ek+".advertise", ep.e.Advertise, true)
			} else if ip := net.ParseIP(h); ip != nil && ip.IsUnspecified() {
				k.add(ek+".advertise", "missing while the listen address %s is a wildcard; expected the address others should connect to", h)
			}
		}
		if ep.e.Port < 1 || ep.e.Port > 65535 {
			k.add(ek+".port", "%d is not a TCP port; expected 1-65535", ep.e.Port)
		} else {
			listeners = append(listeners, listener{ek + ".port", n.Name, h, ep.e.Port})
		}
	}
	return listeners
}

// checkDrives checks node n's drives, recording each newly named one in
// driveAt (its key) and driveNode (its node).
func checkDrives(k *checker, key string, n Node, driveAt, driveNode map[string]string) {
	for j, d := range n.Drives {
		dk := fmt.Sprintf("%s.drives[%d]", key, j)
		switch {
		case d.Name == "":
			k.add(dk+".name", "missing; expected a cluster-wide unique drive name such as \"%s%d\"", n.Name, j+1)
		case !nameRE.MatchString(d.Name):
			k.add(dk+".name", "%q has characters other than letters, digits, '-', '_' and '.'", d.Name)
		default:
			if prev, dup := driveAt[d.Name]; dup {
				k.add(dk+".name", "duplicate drive name %q (also %s); expected drive names unique across the cluster", d.Name, prev)
			} else {
				driveAt[d.Name] = dk
				driveNode[d.Name] = n.Name
			}
		}
		refs := 0
		for _, r := range []string{d.Path, d.ByID, d.Serial} {
			if r != "" {
				refs++
			}
		}
		if refs != 1 {
			k.add(dk, "has %d of path, by_id and serial; expected exactly one", refs)
		}
		if d.Size < 0 || d.Size%4096 != 0 {
			k.add(dk+".size", "%d bytes is not a multiple of 4096; expected e.g. 64MiB", int64(d.Size))
		} else if d.Size != 0 && d.Path == "" {
			k.add(dk+".size", "set for a drive without a path; size only applies to file-backed drives given by path")
		}
	}
}

// checkControlPlane checks the etcd settings and appends the embedded
// peers' etcd listeners to listeners.
func (c *Config) checkControlPlane(k *checker, nodeAt map[string]int, listeners []listener) []listener {
	e := c.ControlPlane.Etcd
	switch {
	case len(e.Peers) > 0 && len(e.Endpoints) > 0:
		k.add("control_plane.etcd", "both peers (embedded etcd) and endpoints (external etcd) are set; expected one of them")
	case len(e.Peers) == 0 && len(e.Endpoints) == 0:
		k.add("control_plane.etcd", "neither peers nor endpoints is set; expected peers: [node names] for embedded etcd or endpoints: [http://host:2379] for an external one")
	}
	if len(e.Peers) > 0 && len(e.Peers)%2 == 0 {
		k.add("control_plane.etcd.peers", "%d voting peers; expected an odd number (1, 3 or 5) so that a majority survives a failure", len(e.Peers))
	}
	seenPeer := map[string]bool{}
	for i, p := range e.Peers {
		pk := fmt.Sprintf("control_plane.etcd.peers[%d]", i)
		n, ok := c.Node(p)
		switch {
		case !ok:
			k.add(pk, "node %q is not defined; expected one of %s", p, c.nodeNames())
		case seenPeer[p]:
			k.add(pk, "node %q is listed twice; expected each peer once", p)
		default:
			seenPeer[p] = true
			cp, pp := c.etcdPorts(n)
			nk := fmt.Sprintf("nodes[%d].etcd", nodeAt[p])
			for _, x := range []struct {
				name string
				port int
			}{{"client_port", cp}, {"peer_port", pp}} {
				if x.port < 1 || x.port > 65535 {
					k.add(nk+"."+x.name, "%d is not a TCP port; expected 1-65535", x.port)
				} else {
					listeners = append(listeners, listener{nk + "." + x.name, p, n.hostOf(n.API), x.port})
				}
			}
		}
	}
	if len(e.Peers) > 0 {
		c.checkRaft(k)
	}
	for i, ep := range e.Endpoints {
		u, err := url.Parse(ep)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Port() == "" {
			k.add(fmt.Sprintf("control_plane.etcd.endpoints[%d]", i), "%q is not an etcd client URL; expected e.g. http://10.0.0.1:2379", ep)
		}
	}
	return listeners
}

// checkRaft checks the embedded members' raft timings against each other
// and against the liveness lease they must serve.
func (c *Config) checkRaft(k *checker) {
	e, lease := c.ControlPlane.Etcd, c.Policies.LeaseTTL.D()
	tick, election := e.Tick.D(), e.Election.D()
	if tick == 0 && election == 0 {
		return // the defaults (Load fills them in)
	}
	if tick == 0 {
		tick = DefaultEtcdTick
	}
	if election == 0 {
		election = 10 * tick
	}
	switch {
	case tick < 10*time.Millisecond || tick > 5*time.Second:
		k.add("control_plane.etcd.tick", "%s; expected 10ms to 5s (default 50ms)", e.Tick)
	case election < 5*tick || election > 50*time.Second:
		k.add("control_plane.etcd.election", "%s with tick %s; expected 5 × tick to 50s (default 10 × tick)", Duration(election), Duration(tick))
	case lease > 0 && 3*election > lease:
		k.add("control_plane.etcd.election", "%s; a lost raft leader may stall lease renewals for up to 2 × election, so expected at most policies.lease_ttl/3 = %s (raise lease_ttl or lower election)", Duration(election), (lease / 3).Round(time.Millisecond))
	}
}

// checkPortClashes reports the same port twice on one node (unless both
// listen on different specific addresses), or on two nodes that share an
// address.
func checkPortClashes(k *checker, listeners []listener) {
	for i := 0; i < len(listeners); i++ {
		for j := 0; j < i; j++ {
			a, b := listeners[i], listeners[j]
			if a.port != b.port {
				continue
			}
			if a.node == b.node && (a.host == b.host || isWildcard(a.host) || isWildcard(b.host)) ||
				a.node != b.node && a.host == b.host && !isWildcard(a.host) {
				k.add(a.key, "port %d on %s clashes with %s (node %s); expected a distinct port per listener on one address", a.port, a.host, b.key, b.node)
				break
			}
		}
	}
}

// checkArrays checks every array and reports whether all of them are
// sound (automatic placement only runs then).
func (c *Config) checkArrays(k *checker, nodeAt map[string]int, driveNode map[string]string) bool {
	arrayAt := map[string]int{}
	arraysOK := true
	for i := range c.Arrays {
		a := &c.Arrays[i]
		key := fmt.Sprintf("arrays[%d]", i)
		n0 := len(k.probs)
		switch {
		case a.Name == "":
			k.add(key+".name", "missing; expected a short array name such as \"A\"")
		case !nameRE.MatchString(a.Name):
			k.add(key+".name", "%q has characters other than letters, digits, '-', '_' and '.'", a.Name)
		default:
			if j, dup := arrayAt[a.Name]; dup {
				k.add(key+".name", "duplicate array name %q (also arrays[%d]); expected every array name to be unique", a.Name, j)
			} else {
				arrayAt[a.Name] = i
			}
		}
		homeOK := c.checkArrayShape(k, key, a, nodeAt)
		checkMembers(k, key, a, homeOK, driveNode)
		if len(k.probs) > n0 {
			arraysOK = false
		}
	}
	return arraysOK
}

// checkArrayShape checks array a's level, chunk size, home node and
// width. It reports whether the home node is defined.
func (c *Config) checkArrayShape(k *checker, key string, a *Array, nodeAt map[string]int) (homeOK bool) {
	minW := map[string]int{RAID5: 3, RAID6: 4}
	mw, levelOK := minW[a.Level]
	switch {
	case a.Level == RAID0 || a.Level == RAID1:
		// the RAID engine has them, the failover machine refuses them
		// (cluster.ParseLevel): no node would ever assemble the array
		k.add(key+".level", "%s is not run by the cluster's failover (only parity arrays are: a node would refuse to assemble it); expected raid5 (at least 3 members, survives one loss) or raid6 (at least 4, survives two)", a.Level)
	case !levelOK:
		k.add(key+".level", "%q is not a RAID level; expected raid5 or raid6", a.Level)
	}
	if a.ChunkKiB < 4 || a.ChunkKiB > 4096 || a.ChunkKiB&(a.ChunkKiB-1) != 0 {
		k.add(key+".chunk_kib", "%d is not a power of two from 4 to 4096; expected e.g. 128", a.ChunkKiB)
	}
	if a.Home == "" {
		k.add(key+".home", "missing; expected the name of the node that owns the array when healthy, one of %s", c.nodeNames())
	} else if _, ok := nodeAt[a.Home]; !ok {
		k.add(key+".home", "node %q is not defined; expected one of %s", a.Home, c.nodeNames())
	} else {
		homeOK = true
	}
	if !a.Auto && a.Width != len(a.Members) {
		k.add(key+".width", "%d but %d members are listed; expected the width to match the member list or be left out", a.Width, len(a.Members))
	}
	if a.HomeMember && a.Auto {
		k.add(key+".home_member", "true with automatic placement; expected an explicit members list (home_member allows one listed member on the home node)")
	}
	if a.HomeMember && a.Width > len(c.Nodes) {
		k.add(key+".width", "array is %d wide but the cluster has %d nodes; expected at most one member per node", a.Width, len(c.Nodes))
	} else if !a.HomeMember && a.Width > len(c.Nodes)-1 {
		k.add(key+".width", "array is %d wide but the cluster has %d nodes; expected at most nodes-1 = %d (no member on the home node, no two members on one node)", a.Width, len(c.Nodes), len(c.Nodes)-1)
	}
	if levelOK && a.Width < mw {
		k.add(key+".width", "%s needs at least %d members, got %d", a.Level, mw, a.Width)
	}
	return homeOK
}

// checkMembers checks that array a's members are defined drives, distinct,
// on distinct nodes and (with homeOK) not on the home node.
func checkMembers(k *checker, key string, a *Array, homeOK bool, driveNode map[string]string) {
	onNode := map[string]int{}
	seen := map[string]int{}
	for j, m := range a.Members {
		mk := fmt.Sprintf("%s.members[%d]", key, j)
		if m == "" {
			continue // reported while decoding
		}
		node, ok := driveNode[m]
		if !ok {
			k.add(mk, "drive %q is not defined on any node; expected one of the drives listed under nodes[].drives", m)
			continue
		}
		if p, dup := seen[m]; dup {
			k.add(mk, "drive %q is listed twice (also members[%d]); expected distinct drives", m, p)
			continue
		}
		seen[m] = j
		if p, two := onNode[node]; two {
			k.add(mk, "drive %q is on node %s, like members[%d] (%s); expected at most one member per node so that losing a node costs one member", m, node, p, a.Members[p])
		}
		onNode[node] = j
		if homeOK && node == a.Home && !a.HomeMember {
			k.add(mk, "drive %q is on the array's home node %s; expected members on other nodes only, so the array survives its home node's loss complete (or home_member: true, for a cluster too small, accepting a degraded array after that loss)", m, node)
		}
	}
}

func (c *Config) checkPlacement(k *checker) {
	switch c.Placement.Domains {
	case "none":
	case "distinct", "survive":
		for i, n := range c.Nodes {
			if n.Domain == "" {
				k.add(fmt.Sprintf("nodes[%d].domain", i), "missing while placement.domains is %q; expected a failure domain (rack) name for every node", c.Placement.Domains)
			}
		}
	default:
		k.add("placement.domains", "%q is not a domain policy; expected none, distinct or survive", c.Placement.Domains)
	}
}

func (c *Config) checkFabrics(k *checker) {
	if !strings.HasPrefix(c.Fabrics.NQNPrefix, "nqn.") {
		k.add("fabrics.nqn_prefix", "%q does not start with \"nqn.\"; expected e.g. %s", c.Fabrics.NQNPrefix, DefaultNQNPrefix)
	}
	for _, f := range []struct {
		name string
		f    Fabric
	}{{"backend", c.Fabrics.Backend}, {"frontend", c.Fabrics.Frontend}} {
		fk := "fabrics." + f.name
		switch f.f.Transport {
		case TransportTCP:
		case TransportRDMA:
			if f.f.HeaderDigest || f.f.DataDigest {
				k.add(fk+".transport", "rdma with header_digest/data_digest set; digests are NVMe/TCP's (RDMA's link checks its packets itself): drop them or use transport tcp")
			}
		default:
			k.add(fk+".transport", "%q is not a transport; expected tcp or rdma", f.f.Transport)
		}
		if ct := f.f.ConnectTimeout.D(); ct != 0 && (ct < time.Second || ct > 5*time.Minute) {
			k.add(fk+".connect_timeout", "%s; expected 1s to 5m (default 10s: the longest a host may take from its connection to a finished Connect)", f.f.ConnectTimeout)
		}
		if f.f.Queues < 1 || f.f.Queues > 128 {
			k.add(fk+".queues", "%d; expected 1-128 I/O queues", f.f.Queues)
		}
		if f.f.QueueDepth < 2 || f.f.QueueDepth > 1024 {
			k.add(fk+".queue_depth", "%d; expected 2-1024", f.f.QueueDepth)
		}
		for i, h := range f.f.AllowHosts {
			if !strings.HasPrefix(h, "nqn.") {
				k.add(fmt.Sprintf("%s.allow_hosts[%d]", fk, i), "%q is not an NQN; expected e.g. nqn.2014-08.org.nvmexpress:uuid:...", h)
			}
		}
		for key, v := range map[string]string{"dhchap_secret": f.f.DHCHAPSecret, "dhchap_ctrl_secret": f.f.DHCHAPCtrlSecret} {
			if v == "" || strings.HasPrefix(v, "file:") {
				continue
			}
			if _, err := nvme.ParseDHCHAPSecret(v); err != nil {
				// The message never repeats any of the secret.
				k.add(fk+"."+key, "not a valid DH-HMAC-CHAP secret (wrong format, length or checksum); expected DHHC-1:<hash>:<base64>: as `nvme gen-dhchap-key` prints it, or file:PATH")
			}
		}
		if f.f.DHCHAPCtrlSecret != "" && f.f.DHCHAPSecret == "" {
			k.add(fk+".dhchap_ctrl_secret", "set without dhchap_secret; bidirectional authentication needs the host secret too")
		}
	}
}

func (c *Config) checkPolicies(k *checker) {
	p := c.Policies
	if p.Failback != "auto" && p.Failback != "manual" {
		k.add("policies.failback", "%q; expected auto or manual", p.Failback)
	}
	if p.RebuildRateMiBs < 0 {
		k.add("policies.rebuild_rate_mibs", "%d; expected a positive MiB/s rate", p.RebuildRateMiBs)
	}
	if p.LeaseTTL < 0 {
		k.add("policies.lease_ttl", "%s; expected a positive duration such as 5s", p.LeaseTTL)
	}
	if p.MemberIOTimeout < 0 {
		k.add("policies.member_io_timeout", "%s; expected a positive duration such as 5s", p.MemberIOTimeout)
	}
	if p.MemberSlowRead < 0 {
		k.add("policies.member_slow_read", "%s; expected a positive duration such as 20ms, well below member_io_timeout", p.MemberSlowRead)
	}
	if p.MemberSlowWrite < 0 || p.MemberIOTimeout > 0 && p.MemberSlowWrite >= p.MemberIOTimeout {
		k.add("policies.member_slow_write", "%s; expected a positive duration below member_io_timeout (%s), such as 50ms", p.MemberSlowWrite, p.MemberIOTimeout)
	}
	if h := p.HousekeepingInterval.D(); h != 0 && (h < 100*time.Millisecond || h > time.Minute) {
		k.add("policies.housekeeping_interval", "%s; expected 100ms to 1m (default 1s)", p.HousekeepingInterval)
	}
	if p.MemberIORetries != nil && *p.MemberIORetries < 0 {
		k.add("policies.member_io_retries", "%d; expected 0 or more", *p.MemberIORetries)
	}
}

func (c *Config) checkSlurm(k *checker, nodeAt map[string]int) {
	for i, m := range c.Slurm.Nodes {
		if _, ok := nodeAt[m.Node]; !ok {
			k.add(fmt.Sprintf("slurm.nodes[%d].node", i), "node %q is not defined; expected one of %s", m.Node, c.nodeNames())
		}
		if m.Slurm == "" {
			k.add(fmt.Sprintf("slurm.nodes[%d].slurm", i), "missing; expected the Slurm node name of %s", m.Node)
		}
	}
}

func hasArrayOrNodeProblem(ps []Problem) bool {
	return slices.ContainsFunc(ps, func(p Problem) bool {
		return strings.HasPrefix(p.Key, "arrays") || strings.HasPrefix(p.Key, "nodes") || strings.HasPrefix(p.Key, "placement")
	})
}

func (c *Config) resolvePlacement(k *checker) {
	anyAuto := slices.ContainsFunc(c.Arrays, func(a Array) bool { return a.Auto && len(a.Members) == 0 })
	if !anyAuto {
		return
	}
	res, err := Place(c.placeRequest())
	if err != nil {
		// Name the array the error is about.
		key := "arrays"
		for i, a := range c.Arrays {
			if strings.HasPrefix(err.Error(), "array "+a.Name+":") {
				key = fmt.Sprintf("arrays[%d].members", i)
			}
		}
		k.add(key, "automatic placement failed: %v", err)
		return
	}
	for i := range c.Arrays {
		c.Arrays[i].Members = res[i]
	}
}
