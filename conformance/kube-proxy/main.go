// kcache-kube-proxy: kube-proxy's informers of the pinned Kubernetes version, as its
// server wires them (cmd/kube-proxy/app/server.go): one SharedInformerFactory whose list
// options carry kube-proxy's label selector
// `!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless`, informing on
// Services and discovery.k8s.io/v1 EndpointSlices — streaming lists on (client-go's
// default), the watchlist consistency detector on when KUBE_WATCHLIST_INCONSISTENCY_DETECTOR
// is set, protobuf as kube-proxy asks for it.
//
// Through --server (bearer --token, server certificate not verified) it prints
//
//	synced services=N endpointslices=M
//
// once both have synced, then waits until an EndpointSlice named --await-name (in any
// namespace) carries label `v` = --await-value, and prints one JSON line: each informer's
// store as namespace/name → resourceVersion, RVs that went back, and the requests made.
// Exit 0; 1 on timeout or error; the detector's panic exits 2.
//
// Built by scripts/k8s/build-programs.sh; run by services/tests/kube_proxy.rs.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"kcache.local/judges/judgelib"
)

func store(inf cache.SharedIndexInformer) map[string]string {
	out := map[string]string{}
	for _, obj := range inf.GetStore().List() {
		if m, ok := obj.(metav1.Object); ok {
			out[m.GetNamespace()+"/"+m.GetName()] = m.GetResourceVersion()
		}
	}
	return out
}

func main() {
	server := flag.String("server", "", "API server (or kcache) URL")
	token := flag.String("token", "", "bearer token")
	awaitName := flag.String("await-name", "", "EndpointSlice to wait for")
	awaitValue := flag.String("await-value", "", "its label v to wait for")
	timeout := flag.Duration("timeout", 120*time.Second, "give up after")
	flag.Parse()

	cfg, reqs := judgelib.Config(*server, *token, true)
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		os.Exit(1)
	}
	// kube-proxy's selector (cmd/kube-proxy/app/server.go).
	noProxyName, err := labels.NewRequirement("service.kubernetes.io/service-proxy-name", selection.DoesNotExist, nil)
	if err != nil {
		panic(err)
	}
	noHeadless, err := labels.NewRequirement("service.kubernetes.io/headless", selection.DoesNotExist, nil)
	if err != nil {
		panic(err)
	}
	selector := labels.NewSelector().Add(*noProxyName, *noHeadless)
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = selector.String() }))
	services := factory.Core().V1().Services().Informer()
	slices := factory.Discovery().V1().EndpointSlices().Informer()
	j := judgelib.NewNoGoingBack()
	for _, inf := range []cache.SharedIndexInformer{services, slices} {
		_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    j.Saw,
			UpdateFunc: func(_, obj interface{}) { j.Saw(obj) },
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), services.HasSynced, slices.HasSynced) {
		fmt.Fprintln(os.Stderr, "not synced before the timeout")
		os.Exit(1)
	}
	fmt.Printf("synced services=%d endpointslices=%d\n", len(services.GetStore().List()), len(slices.GetStore().List()))
	for done := false; !done; {
		for _, obj := range slices.GetStore().List() {
			if s, ok := obj.(*discoveryv1.EndpointSlice); ok && s.Name == *awaitName && s.Labels["v"] == *awaitValue {
				done = true
			}
		}
		if done {
			break
		}
		select {
		case <-ctx.Done():
			fmt.Fprintf(os.Stderr, "timed out waiting for %s v=%s\n", *awaitName, *awaitValue)
			os.Exit(1)
		case <-time.After(20 * time.Millisecond):
		}
	}
	summary := map[string]interface{}{
		"services":       store(services),
		"endpointSlices": store(slices),
		"wentBack":       j.Went(),
	}
	for k, v := range reqs.Counts() {
		summary[k] = v
	}
	out, _ := json.Marshal(summary)
	fmt.Println(string(out))
}
