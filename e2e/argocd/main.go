// Command argocd runs the two Argo CD components shardwise's suites need, chosen as Argo CD's
// own multi-call binary chooses: by ARGOCD_BINARY_NAME, else by the name it was started under.
// Only these two are linked in, which keeps the build to the controller's and repo server's
// dependencies (no API server, UI, Dex or CLI).
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	appcontroller "github.com/argoproj/argo-cd/v3/cmd/argocd-application-controller/commands"
	reposerver "github.com/argoproj/argo-cd/v3/cmd/argocd-repo-server/commands"
	"github.com/argoproj/argo-cd/v3/util/log"
)

func main() {
	// Argo CD's components log through logrus; klog (client-go's) goes the same way, as in
	// Argo CD's own binary.
	klog.SetLogger(log.NewLogrusLogger(log.NewWithCurrentConfig()))
	name := os.Getenv("ARGOCD_BINARY_NAME")
	if name == "" {
		name = filepath.Base(os.Args[0])
	}
	var command *cobra.Command
	switch name {
	case "argocd-application-controller":
		command = appcontroller.NewCommand()
	case "argocd-repo-server":
		command = reposerver.NewCommand()
	default:
		fmt.Fprintf(os.Stderr, "argocd: %q is not a component of this build (argocd-application-controller, argocd-repo-server)\n", name)
		os.Exit(2)
	}
	if err := command.Execute(); err != nil {
		os.Exit(1)
	}
}
