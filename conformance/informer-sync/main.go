// kcache-informer: an unchanged client-go SharedInformer of the pinned Kubernetes version,
// as controllers run it — streaming lists on (client-go's default since 1.35), and the
// watchlist consistency detector on when KUBE_WATCHLIST_INCONSISTENCY_DETECTOR=true (it
// re-lists at each initial-events-end bookmark's resourceVersion with Exact and panics
// on any difference) — reporting what it saw.
//
// It informs on one namespace's ConfigMaps through --server (bearer --token, server
// certificate not verified) and prints:
//
//	synced N initial=<names in the first synced state, comma-separated>
//
// once it has synced, then waits until its store holds ConfigMap --await-name with
// data.v == --await-value and prints one JSON line: the store (name → data.v), how many
// times an object's resourceVersion went back, and the requests it made (lists, watches,
// streaming lists). Exit 0 then; 1 on timeout or error; a panic (the detector) exits 2.
//
// Built by scripts/k8s/build-programs.sh; run by services/tests/client_go.rs.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"kcache.local/judges/judgelib"
)

func main() {
	server := flag.String("server", "", "API server (or kcache) URL")
	token := flag.String("token", "", "bearer token")
	namespace := flag.String("namespace", "default", "namespace")
	awaitName := flag.String("await-name", "", "ConfigMap to wait for")
	awaitValue := flag.String("await-value", "", "its data.v to wait for")
	timeout := flag.Duration("timeout", 120*time.Second, "give up after")
	flag.Parse()

	cfg, reqs := judgelib.Config(*server, *token, false)
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		os.Exit(1)
	}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(*namespace))
	inf := factory.Core().V1().ConfigMaps().Informer()
	j := judgelib.NewNoGoingBack()
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    j.Saw,
		UpdateFunc: func(_, obj interface{}) { j.Saw(obj) },
	})
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		fmt.Fprintln(os.Stderr, "not synced before the timeout")
		os.Exit(1)
	}
	initial := inf.GetStore().ListKeys()
	sort.Strings(initial)
	fmt.Printf("synced %d initial=%s\n", len(initial), strings.Join(initial, ","))

	for {
		if obj, ok, _ := inf.GetStore().GetByKey(*namespace + "/" + *awaitName); ok {
			if cm, isCM := obj.(*corev1.ConfigMap); isCM && cm.Data["v"] == *awaitValue {
				break
			}
		}
		select {
		case <-ctx.Done():
			fmt.Fprintf(os.Stderr, "timed out waiting for %s=%s\n", *awaitName, *awaitValue)
			os.Exit(1)
		case <-time.After(20 * time.Millisecond):
		}
	}
	objects := map[string]string{}
	rvs := map[string]string{}
	for _, obj := range inf.GetStore().List() {
		cm := obj.(*corev1.ConfigMap)
		objects[cm.Name] = cm.Data["v"]
		rvs[cm.Name] = cm.ResourceVersion
	}
	summary := map[string]interface{}{
		"objects":          objects,
		"resourceVersions": rvs,
		"wentBack":         j.Went(),
	}
	for k, v := range reqs.Counts() {
		summary[k] = v
	}
	out, _ := json.Marshal(summary)
	fmt.Println(string(out))
}
