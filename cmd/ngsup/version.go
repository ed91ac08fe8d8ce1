package main

import (
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/ngharness/ngharness/pkg/proto"
)

// version and commit are set at build time (-ldflags -X).
var (
	version = "dev"
	commit  = ""
)

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit and Go version",
		Args:  noArgs,
		RunE: func(c *cobra.Command, args []string) error {
			res := proto.VersionResult{Version: version, Commit: commit, GoVersion: runtime.Version()}
			if res.Commit == "" {
				if bi, ok := debug.ReadBuildInfo(); ok {
					for _, s := range bi.Settings {
						if s.Key == "vcs.revision" {
							res.Commit = s.Value
						}
					}
				}
			}
			return result(res, proto.ExitOK, nil)
		},
	}
}
