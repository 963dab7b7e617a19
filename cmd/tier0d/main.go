package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"tier0/daemon/config"
	"tier0/daemon/node"
	"tier0/internal/version"
)

func main() {
	site := flag.String("site", "/etc/tier0/site.yaml", "site configuration file")
	name := flag.String("node", "", "this node's name in the site configuration (default: the host name)")
	level := flag.String("log-level", "info", "log level: debug, info, warn, error")
	tokenFile := flag.String("token-file", "", "file holding the bearer token for mutating API calls (also TIER0_TOKEN)")
	tick := flag.Duration("tick", 500*time.Millisecond, "control plane state machine tick")
	tlsCert := flag.String("tls-cert", "", "PEM certificate: serve the management API over HTTPS (with --tls-key)")
	tlsKey := flag.String("tls-key", "", "PEM private key of --tls-cert")
	tlsClientCA := flag.String("tls-client-ca", "", "PEM CA bundle: require API clients to present a certificate it signed (mTLS)")
	join := flag.Bool("etcd-join-existing", false, "start this node's embedded etcd member as a replacement joining the running cluster (after `etcdctl member add`; see docs/CONTROL-PLANE.md)")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println("tier0d", version.String())
		return
	}
	tc, err := tlsConfig(*tlsCert, *tlsKey, *tlsClientCA)
	if err != nil {
		fmt.Fprintln(os.Stderr, "tier0d:", err)
		os.Exit(2)
	}
	if err := run(*site, *name, *level, *tokenFile, *tick, *join, tc); err != nil {
		fmt.Fprintln(os.Stderr, "tier0d:", err)
		os.Exit(1)
	}
}

// tlsConfig builds the management API's TLS settings (nil: plain HTTP).
func tlsConfig(cert, key, clientCA string) (*tls.Config, error) {
	if cert == "" && key == "" {
		if clientCA != "" {
			return nil, fmt.Errorf("--tls-client-ca needs --tls-cert and --tls-key")
		}
		return nil, nil
	}
	if cert == "" || key == "" {
		return nil, fmt.Errorf("--tls-cert and --tls-key go together (got cert %q, key %q)", cert, key)
	}
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}
	if clientCA != "" {
		pem, err := os.ReadFile(clientCA)
		if err != nil {
			return nil, fmt.Errorf("--tls-client-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--tls-client-ca %s: no PEM certificate found in it", clientCA)
		}
		tc.ClientCAs, tc.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return tc, nil
}

func run(site, name, level, tokenFile string, tick time.Duration, join bool, tc *tls.Config) error {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	if name == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("--node not given and the host name is unknown: %w", err)
		}
		name = strings.Split(h, ".")[0]
	}
	cfg, err := config.Load(site)
	if err != nil {
		return err
	}
	token := os.Getenv("TIER0_TOKEN")
	if tokenFile != "" {
		b, err := os.ReadFile(tokenFile)
		if err != nil {
			return fmt.Errorf("--token-file: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lv}))
	n, err := node.New(node.Options{Config: cfg, Name: name, Logger: log, Tick: tick, Token: token, JoinExisting: join, TLS: tc})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return n.Run(ctx)
}
