package main

import (
	"fmt"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"tier0/daemon/nvme"
)

// genKeyOptions are the flags of fabric gen-dhchap-key.
type genKeyOptions struct {
	keyLen int
	hash   string
}

func (o *genKeyOptions) AddFlags(f *pflag.FlagSet) {
	f.IntVar(&o.keyLen, "key-length", 32, "secret length in bytes: 32, 48 or 64")
	f.StringVar(&o.hash, "hash", "none", "transformation hash: none, sha256, sha384 or sha512")
}

func newFabricGenKeyCmd() *cobra.Command {
	o := &genKeyOptions{}
	cmd := &cobra.Command{
		Use:   "gen-dhchap-key",
		Short: "Print a new DH-HMAC-CHAP secret (DHHC-1:..:) for fabrics.*.dhchap_secret or nvme connect --dhchap-secret",
		Long: `Prints a new random DH-HMAC-CHAP secret in the representation nvme-cli and
Linux use (the same as nvme gen-dhchap-key). Put it in a file readable only by
root and refer to it as file:PATH in the site configuration.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			h := uint8(0)
			if o.hash != "none" {
				var err error
				if h, err = nvme.ParseHashName(o.hash); err != nil {
					return fmt.Errorf("--hash %q: expected none, sha256, sha384 or sha512", o.hash)
				}
			}
			s, err := nvme.GenerateDHCHAPSecret(o.keyLen, h)
			if err != nil {
				return fmt.Errorf("--key-length %d: %w (expected 32, 48 or 64)", o.keyLen, err)
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), s)
			return err
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}
