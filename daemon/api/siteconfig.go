package api

import (
	"context"
	"net/http"

	"tier0/daemon/config"
)

// GET /v1/config: the site configuration the answering node runs with
// (`tier0 config export` builds the site file from it and the live
// arrays and volumes). Secrets are never sent: Secrets names the secret
// keys that are set, with their "file:PATH" reference or "inline".

// SiteConfig is the answer of GET /v1/config.
type SiteConfig struct {
	Config config.Config `json:"config"`
	// Secrets maps each set secret key (fabrics.frontend.dhchap_secret,
	// ...) to its file: reference, or to "inline" for a secret written in
	// the site file itself.
	Secrets map[string]string `json:"secrets,omitempty"`
}

// SiteConfiger is the optional part of a Backend that serves GET /v1/config.
type SiteConfiger interface {
	SiteConfig(ctx context.Context) (SiteConfig, error)
}

func (s *Server) siteConfigRoutes(b SiteConfiger) {
	s.get("/v1/config", func(r *http.Request) (any, error) { return b.SiteConfig(r.Context()) })
}

// SiteConfig is GET /v1/config.
func (c *Client) SiteConfig(ctx context.Context) (SiteConfig, error) {
	var out SiteConfig
	err := c.do(ctx, http.MethodGet, "/v1/config", false, &out)
	return out, err
}
