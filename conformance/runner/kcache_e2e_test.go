// Package kcachee2e is kcache's own ginkgo (v2) entry point into Kubernetes' end-to-end
// specs at the reference version: test/e2e/apimachinery (the [sig-api-machinery] specs,
// watchlist and consistent-list specs included) and test/e2e/common (which holds the
// ConfigMap and Secret API specs).
//
// scripts/k8s/build-programs.sh builds it with `go test -c` inside a wrapper module that
// requires k8s.io/kubernetes at the pinned version (scripts/k8s/versions.env). Unlike
// test/e2e/e2e.go this suite registers no SynchronizedBeforeSuite: it never waits for
// nodes, system pods or daemonsets, so specs can run against a bare kube-apiserver + etcd.
//
// Run it with e.g.
//
//	kcache-e2e.test --provider skeleton --kubeconfig $KUBECONFIG \
//	  --e2e-verify-service-account=false --delete-namespace=false \
//	  --report-dir DIR --report-prefix NAME --ginkgo.focus REGEX
//
// --report-dir makes the framework write DIR/junit_<NAME>01.xml.
package kcachee2e

import (
	"flag"
	"os"
	"testing"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"

	"k8s.io/component-base/logs"
	"k8s.io/kubernetes/test/e2e/common"
	"k8s.io/kubernetes/test/e2e/framework"
	e2econfig "k8s.io/kubernetes/test/e2e/framework/config"
	"k8s.io/kubernetes/test/e2e/framework/testfiles"
	e2etestingmanifests "k8s.io/kubernetes/test/e2e/testing-manifests"
	testfixtures "k8s.io/kubernetes/test/fixtures"

	// Spec packages. Importing a package registers its ginkgo specs.
	_ "k8s.io/kubernetes/test/e2e/apimachinery"
	_ "k8s.io/kubernetes/test/e2e/common/node"
	_ "k8s.io/kubernetes/test/e2e/common/storage"

	// Framework extensions the upstream suite loads too (debug dumps, metrics, node helpers).
	_ "k8s.io/kubernetes/test/e2e/framework/debug/init"

	// Client auth plugins, in case a kubeconfig uses one.
	_ "k8s.io/client-go/plugin/pkg/client/auth"
)

func TestMain(m *testing.M) {
	// Flags of specs that register their own options, then the framework's flags.
	e2econfig.CopyFlags(e2econfig.Flags, flag.CommandLine)
	framework.RegisterCommonFlags(flag.CommandLine)
	framework.RegisterClusterFlags(flag.CommandLine)
	flag.Parse()
	testfiles.AddFileSource(e2etestingmanifests.GetE2ETestingManifestsFS())
	testfiles.AddFileSource(testfixtures.GetTestFixturesFS())
	framework.AfterReadingAllFlags(&framework.TestContext)
	os.Exit(m.Run())
}

func TestKcacheE2E(t *testing.T) {
	logs.InitLogs()
	defer logs.FlushLogs()
	// Some specs in test/e2e/common behave differently in the node e2e suite.
	common.CurrentSuite = common.E2E
	gomega.RegisterFailHandler(framework.Fail)
	suiteConfig, reporterConfig := framework.CreateGinkgoConfig()
	ginkgo.RunSpecs(t, "kcache-e2e", suiteConfig, reporterConfig)
}
