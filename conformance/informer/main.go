// kcache-pb-informer: a client-go (v1.20.2) ConfigMap informer that speaks protobuf only,
// as the kubelet and kube-proxy do, and reports what crossed the wire.
//
// It lists and watches one namespace's ConfigMaps through --server with
// ContentType/AcceptContentTypes application/vnd.kubernetes.protobuf, prints "synced N"
// once its cache has synced, then waits until an object named --await has arrived (by
// watch) and prints one JSON summary line: the objects in its cache, the awaited object's
// data, and every response's Content-Type with whether the body began with protobuf's
// "k8s\x00" magic (lists and gets) — so a JSON answer is caught even though client-go
// would decode one. Exit 0 on success, 1 on timeout or error.
//
// Built by scripts/install-e2e-specs.sh from the same Kubernetes source tree as the e2e
// runner; run by services/tests/protobuf.rs.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

type wire struct {
	mu        sync.Mutex
	responses []response
}

type response struct {
	Watch       bool   `json:"watch"`
	Status      int    `json:"status"`
	ContentType string `json:"contentType"`
	// Lists and gets: whether the body began with the protobuf envelope's magic.
	Magic bool `json:"magic"`
}

type recorder struct {
	next http.RoundTripper
	w    *wire
}

func (r recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := r.next.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	rec := response{
		Watch:       req.URL.Query().Get("watch") == "true" || req.URL.Query().Get("watch") == "1",
		Status:      resp.StatusCode,
		ContentType: resp.Header.Get("Content-Type"),
	}
	if !rec.Watch {
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, err
		}
		rec.Magic = bytes.HasPrefix(body, []byte("k8s\x00"))
		resp.Body = io.NopCloser(bytes.NewReader(body))
	}
	r.w.mu.Lock()
	r.w.responses = append(r.w.responses, rec)
	r.w.mu.Unlock()
	return resp, nil
}

func main() {
	server := flag.String("server", "", "API server or kcache URL")
	token := flag.String("token", "", "bearer token")
	ns := flag.String("namespace", "default", "namespace to watch")
	await := flag.String("await", "", "name of a ConfigMap to wait for")
	timeout := flag.Duration("timeout", 60*time.Second, "give up after")
	flag.Parse()

	w := &wire{}
	cfg := &rest.Config{
		Host:            *server,
		BearerToken:     *token,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		ContentConfig: rest.ContentConfig{
			ContentType:        "application/vnd.kubernetes.protobuf",
			AcceptContentTypes: "application/vnd.kubernetes.protobuf",
		},
		WrapTransport: func(rt http.RoundTripper) http.RoundTripper { return recorder{rt, w} },
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		os.Exit(1)
	}
	arrived := make(chan *corev1.ConfigMap, 1)
	f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(*ns))
	inf := f.Core().V1().ConfigMaps().Informer()
	synced := false
	var mu sync.Mutex
	inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj interface{}) {
			cm, ok := obj.(*corev1.ConfigMap)
			mu.Lock()
			live := synced
			mu.Unlock()
			if ok && live && cm.Name == *await {
				select {
				case arrived <- cm:
				default:
				}
			}
		},
	})
	stop := make(chan struct{})
	defer close(stop)
	f.Start(stop)
	deadline := time.After(*timeout)
	syncDone := make(chan bool, 1)
	go func() { syncDone <- cache.WaitForCacheSync(stop, inf.HasSynced) }()
	select {
	case ok := <-syncDone:
		if !ok {
			fmt.Fprintln(os.Stderr, "cache did not sync")
			os.Exit(1)
		}
	case <-deadline:
		fmt.Fprintln(os.Stderr, "timed out waiting for the cache to sync")
		os.Exit(1)
	}
	mu.Lock()
	synced = true
	mu.Unlock()
	fmt.Printf("synced %d\n", len(inf.GetStore().List()))
	var got *corev1.ConfigMap
	select {
	case got = <-arrived:
	case <-deadline:
		fmt.Fprintf(os.Stderr, "timed out waiting for %q\n", *await)
		os.Exit(1)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	summary := map[string]interface{}{
		"objects":   len(inf.GetStore().List()),
		"awaited":   got.Data,
		"responses": w.responses,
	}
	out, _ := json.Marshal(summary)
	fmt.Println(string(out))
}
