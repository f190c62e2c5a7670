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
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
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

func rvOf(cm *corev1.ConfigMap) uint64 {
	n, _ := strconv.ParseUint(cm.ResourceVersion, 10, 64)
	return n
}

func (j *judge) saw(obj interface{}) {
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	rv := rvOf(cm)
	if last, seen := j.lastRV[cm.Name]; seen && rv < last {
		j.wentBack = append(j.wentBack, fmt.Sprintf("%s %d after %d", cm.Name, rv, last))
	}
	j.lastRV[cm.Name] = rv
}

func main() {
	server := flag.String("server", "", "API server (or kcache) URL")
	token := flag.String("token", "", "bearer token")
	namespace := flag.String("namespace", "default", "namespace")
	awaitName := flag.String("await-name", "", "ConfigMap to wait for")
	awaitValue := flag.String("await-value", "", "its data.v to wait for")
	timeout := flag.Duration("timeout", 120*time.Second, "give up after")
	flag.Parse()

	cfg := &rest.Config{
		Host:            *server,
		BearerToken:     *token,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		QPS:             -1,
	}
	reqs := &requests{}
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return recorder{rt, reqs} }
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		os.Exit(1)
	}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(*namespace))
	inf := factory.Core().V1().ConfigMaps().Informer()
	j := &judge{lastRV: map[string]uint64{}}
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    j.saw,
		UpdateFunc: func(_, obj interface{}) { j.saw(obj) },
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
	j.mu.Lock()
	reqs.mu.Lock()
	out, _ := json.Marshal(map[string]interface{}{
		"objects":          objects,
		"resourceVersions": rvs,
		"wentBack":         j.wentBack,
		"lists":            reqs.Lists,
		"watches":          reqs.Watches,
		"streamingLists":   reqs.StreamingLists,
		"errors":           reqs.Errors,
	})
	reqs.mu.Unlock()
	j.mu.Unlock()
	fmt.Println(string(out))
}
