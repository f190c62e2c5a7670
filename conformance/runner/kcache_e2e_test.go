// Package kcachee2e is kcache's own ginkgo entry point into a subset of the Kubernetes
// 1.20 end-to-end specs: test/e2e/apimachinery (the [sig-api-machinery] specs) and
// test/e2e/common (which holds the ConfigMap and Secret API specs).
//
// scripts/install-e2e-specs.sh copies this directory into the patched Kubernetes source
// tree (as test/e2e/kcache/) and builds it with `go test -c`. Unlike test/e2e/e2e.go this
// suite registers no SynchronizedBeforeSuite: it never waits for nodes, system pods or
// daemonsets, so specs can run against a bare kube-apiserver + etcd.
//
// Run it with e.g.
//
//	kcache-e2e.test --provider skeleton --kubeconfig $KUBECONFIG \
//	  --e2e-verify-service-account=false --delete-namespace=false \
//	  --report-dir DIR --ginkgo.focus REGEX
package kcachee2e

import (
	"flag"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/onsi/ginkgo"
	ginkgoconfig "github.com/onsi/ginkgo/config"
	"github.com/onsi/ginkgo/reporters"
	"github.com/onsi/gomega"

	runtimeutils "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/component-base/logs"
	"k8s.io/kubernetes/test/e2e/common"
	"k8s.io/kubernetes/test/e2e/framework"
	e2econfig "k8s.io/kubernetes/test/e2e/framework/config"

	// Spec packages. Importing a package registers its ginkgo specs.
	_ "k8s.io/kubernetes/test/e2e/apimachinery"

	// Client auth plugins, in case a kubeconfig uses one.
	_ "k8s.io/client-go/plugin/pkg/client/auth"
)

func TestMain(m *testing.M) {
	// Flags of specs that register their own options, then the framework's flags.
	e2econfig.CopyFlags(e2econfig.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	framework.AfterReadingAllFlags(&framework.TestContext)
	// The framework names test namespaces "<base>-<math/rand number>". Unseeded, every
	// process would try the same names in the same order: with --delete-namespace=false
	// (namespaces are never finalized without a controller-manager) each run would then
	// wait 2 s per name already taken, and concurrent runs would keep colliding.
	rand.Seed(time.Now().UnixNano())
	os.Exit(m.Run())
}

func TestKcacheE2E(t *testing.T) {
	runtimeutils.ReallyCrash = true
	logs.InitLogs()
	defer logs.FlushLogs()
	// Some specs in test/e2e/common behave differently in the node e2e suite.
	common.CurrentSuite = common.E2E

	gomega.RegisterFailHandler(framework.Fail)

	var extra []ginkgo.Reporter
	if dir := framework.TestContext.ReportDir; dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatalf("creating --report-dir: %v", err)
		}
		name := fmt.Sprintf("junit_%s%02d.xml", framework.TestContext.ReportPrefix, ginkgoconfig.GinkgoConfig.ParallelNode)
		extra = append(extra, reporters.NewJUnitReporter(filepath.Join(dir, name)))
	}
	// Ginkgo 1.11 matches --ginkgo.focus/skip against "<description> [Top Level] <spec text>",
	// so the description must not contain words that specs are selected by.
	ginkgo.RunSpecsWithDefaultAndCustomReporters(t, "kcache-e2e", extra)
}
