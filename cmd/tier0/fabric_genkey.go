package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"tier0/daemon/nvme"
)

var genKeyOpts struct {
	keyLen int
	hash   string
}

var fabricGenKeyCmd = &cobra.Command{
	Use:   "gen-dhchap-key",
	Short: "Print a new DH-HMAC-CHAP secret (DHHC-1:..:) for fabrics.*.dhchap_secret or nvme connect --dhchap-secret",
	Long: `Prints a new random DH-HMAC-CHAP secret in the representation nvme-cli and
Linux use (the same as nvme gen-dhchap-key). Put it in a file readable only by
root and refer to it as file:PATH in the site configuration.`,
	Args: cobra.NoArgs,
	RunE: func(cmd *cobra.Command, _ []string) error {
		h := uint8(0)
		if genKeyOpts.hash != "none" {
			var err error
			if h, err = nvme.ParseHashName(genKeyOpts.hash); err != nil {
				return fmt.Errorf("--hash %q: expected none, sha256, sha384 or sha512", genKeyOpts.hash)
			}
		}
		s, err := nvme.GenerateDHCHAPSecret(genKeyOpts.keyLen, h)
		if err != nil {
			return fmt.Errorf("--key-length %d: %w (expected 32, 48 or 64)", genKeyOpts.keyLen, err)
		}
		_, err = fmt.Fprintln(cmd.OutOrStdout(), s)
		return err
	},
}

func init() {
	f := fabricGenKeyCmd.Flags()
	f.IntVar(&genKeyOpts.keyLen, "key-length", 32, "secret length in bytes: 32, 48 or 64")
	f.StringVar(&genKeyOpts.hash, "hash", "none", "transformation hash: none, sha256, sha384 or sha512")
	fabricServeGroup().AddCommand(fabricGenKeyCmd)
}
