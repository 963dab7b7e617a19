// Package api is the node daemon's HTTP/JSON management API: a server over
// a Backend the daemon implements, a client for the tier0 CLI and other
// tools, and the Prometheus metrics registry served at /metrics.
//
// Endpoints (JSON unless noted):
//
//	GET  /v1/status                 cluster view: nodes, arrays, lease
//	GET  /v1/arrays                 every array
//	GET  /v1/arrays/{name}          one array (404 if unknown)
//	GET  /v1/events?after=REV&limit=N   failover/event log in write order
//	GET  /v1/node/health            this node's health (Slurm's input)
//	POST /v1/nodes/{node}/drain     move every array off node   [token]
//	POST /v1/nodes/{node}/undrain   let node own arrays again   [token]
//	POST /v1/drives/{id}/fail       mark a drive failed         [token]
//	POST /v1/drives/{id}/replace    a failed drive was replaced [token]
//	POST /v1/arrays/{name}/scrub[?repair=true]  the owner scrubs the array [token]
//	GET|POST /v1/volumes...         volumes (volumes.go)        [token to change]
//	GET  /metrics                   Prometheus text format
//
// Calls marked [token] mutate state and need "Authorization: Bearer
// TOKEN". Errors come back as {"error": "..."} with a status code that the
// client maps back to this package's sentinels.
package api
