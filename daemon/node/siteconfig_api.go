package node

import (
	"context"
	"strings"

	"tier0/daemon/api"
)

// SiteConfig implements api.SiteConfiger: the configuration this node
// runs with, and which secrets are set (their file: references only).
func (n *Node) SiteConfig(context.Context) (api.SiteConfig, error) {
	out := api.SiteConfig{Config: *n.cfg, Secrets: map[string]string{}}
	// The arrays created online are exported with the site file's: the
	// exported file bootstraps the same arrays (members written out).
	out.Config.Arrays = n.managedArrays()
	for key, v := range map[string]string{
		"fabrics.backend.dhchap_secret":       n.cfg.Fabrics.Backend.DHCHAPSecret,
		"fabrics.backend.dhchap_ctrl_secret":  n.cfg.Fabrics.Backend.DHCHAPCtrlSecret,
		"fabrics.frontend.dhchap_secret":      n.cfg.Fabrics.Frontend.DHCHAPSecret,
		"fabrics.frontend.dhchap_ctrl_secret": n.cfg.Fabrics.Frontend.DHCHAPCtrlSecret,
	} {
		switch {
		case v == "":
		case strings.HasPrefix(v, "file:"):
			out.Secrets[key] = v
		default:
			out.Secrets[key] = "inline"
		}
	}
	return out, nil
}
