// Package judgelib is what kcache's client-go judges share: a rest.Config for a test
// server, a transport wrapper that counts the requests a client makes (lists, watches,
// streaming lists, failures), and a check that no object's resourceVersion goes back.
package judgelib

import (
	"fmt"
	"net/http"
	"strconv"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// Requests counts what a client sent, by kind; Errors counts transport errors and
// answers of 400 or more.
type Requests struct {
	mu                                     sync.Mutex
	Lists, Watches, StreamingLists, Errors int
	// Skip, when set, leaves a request uncounted (e.g. a judge's own setup reads).
	Skip func(*http.Request) bool
}

type recorder struct {
	next http.RoundTripper
	r    *Requests
}

func (t recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.r.Skip != nil && t.r.Skip(req) {
		return t.next.RoundTrip(req)
	}
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

// Counts returns the counts as a JSON-ready map.
func (r *Requests) Counts() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return map[string]int{"lists": r.Lists, "watches": r.Watches, "streamingLists": r.StreamingLists, "errors": r.Errors}
}

// Config is a client configuration for server with a bearer token, the server
// certificate not verified (the test servers' are self-signed), no client-side rate
// limit, protobuf first when asked (as the kubelet and kube-proxy), and every request
// counted in the returned Requests.
func Config(server, token string, protobuf bool) (*rest.Config, *Requests) {
	cfg := &rest.Config{
		Host:            server,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		QPS:             -1,
	}
	if protobuf {
		cfg.ContentConfig = rest.ContentConfig{
			AcceptContentTypes: "application/vnd.kubernetes.protobuf,application/json",
			ContentType:        "application/vnd.kubernetes.protobuf",
		}
	}
	reqs := &Requests{}
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { return recorder{rt, reqs} }
	return cfg, reqs
}

// NoGoingBack records each object's last resourceVersion seen by an event handler and
// every time one went back.
type NoGoingBack struct {
	mu       sync.Mutex
	lastRV   map[string]uint64
	WentBack []string
}

func NewNoGoingBack() *NoGoingBack { return &NoGoingBack{lastRV: map[string]uint64{}} }

// Saw is an informer's AddFunc (and UpdateFunc's new object).
func (j *NoGoingBack) Saw(obj interface{}) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return
	}
	rv, _ := strconv.ParseUint(m.GetResourceVersion(), 10, 64)
	key := fmt.Sprintf("%T %s/%s", obj, m.GetNamespace(), m.GetName())
	j.mu.Lock()
	defer j.mu.Unlock()
	if last, seen := j.lastRV[key]; seen && rv < last {
		j.WentBack = append(j.WentBack, fmt.Sprintf("%s %d after %d", key, rv, last))
	}
	j.lastRV[key] = rv
}

// Went returns the going-back records (nil when none).
func (j *NoGoingBack) Went() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.WentBack
}
