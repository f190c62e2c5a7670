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
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

type requests struct {
	mu                                     sync.Mutex
	Lists, Watches, StreamingLists, Errors int
}

type recorder struct {
	next http.RoundTripper
	r    *requests
}

func (t recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	q := req.URL.Query()
	t.r.mu.Lock()
	switch {
	case q.Get("watch") == "true" && q.Get("sendInitialEvents") == "true":
		t.r.StreamingLists++
	case q.Get("watch") == "true":
		t.r.Watches++
	default:
		t.r.Lists++
	}
	t.r.mu.Unlock()
	resp, err := t.next.RoundTrip(req)
	if err != nil || resp.StatusCode >= 400 {
		t.r.mu.Lock()
		t.r.Errors++
		t.r.mu.Unlock()
	}
	return resp, err
}

type judge struct {
	mu       sync.Mutex
	lastRV   map[string]uint64
	wentBack []string
}

func (j *judge) saw(obj interface{}) {
	m, err := metaOf(obj)
	if err != nil {
		return
	}
	rv, _ := strconv.ParseUint(m.GetResourceVersion(), 10, 64)
	key := fmt.Sprintf("%T %s/%s", obj, m.GetNamespace(), m.GetName())
	j.mu.Lock()
	defer j.mu.Unlock()
	if last, seen := j.lastRV[key]; seen && rv < last {
		j.wentBack = append(j.wentBack, fmt.Sprintf("%s %d after %d", key, rv, last))
	}
	j.lastRV[key] = rv
}

func metaOf(obj interface{}) (metav1.Object, error) {
	if m, ok := obj.(metav1.Object); ok {
		return m, nil
	}
	return nil, fmt.Errorf("not an object: %T", obj)
}

func store(inf cache.SharedIndexInformer) map[string]string {
	out := map[string]string{}
	for _, obj := range inf.GetStore().List() {
		if m, err := metaOf(obj); err == nil {
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

	cfg := &rest.Config{
		Host:            *server,
		BearerToken:     *token,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		QPS:             -1,
		ContentConfig: rest.ContentConfig{
			AcceptContentTypes: "application/vnd.kubernetes.protobuf,application/json",
			ContentType:        "application/vnd.kubernetes.protobuf",
		},
	}
	reqs := &requests{}
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return recorder{rt, reqs} }
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
	j := &judge{lastRV: map[string]uint64{}}
	for _, inf := range []cache.SharedIndexInformer{services, slices} {
		_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    j.saw,
			UpdateFunc: func(_, obj interface{}) { j.saw(obj) },
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
	j.mu.Lock()
	reqs.mu.Lock()
	out, _ := json.Marshal(map[string]interface{}{
		"services":       store(services),
		"endpointSlices": store(slices),
		"wentBack":       j.wentBack,
		"lists":          reqs.Lists,
		"watches":        reqs.Watches,
		"streamingLists": reqs.StreamingLists,
		"errors":         reqs.Errors,
	})
	reqs.mu.Unlock()
	j.mu.Unlock()
	fmt.Println(string(out))
}
