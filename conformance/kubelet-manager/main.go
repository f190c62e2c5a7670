// kcache-kubelet: the kubelet's own Secret and ConfigMap wiring of the pinned Kubernetes
// version, unchanged — pkg/kubelet/secret.NewWatchingSecretManager and
// pkg/kubelet/configmap.NewWatchingConfigMapManager: one reflector per referenced object
// (fieldSelector=metadata.name=<n>), each syncing by streaming list (client-go's default
// since 1.35), the 30-minute minimum watch timeout — registered with the pods bound to
// one node, as the kubelet registers them.
//
// It lists the pods with spec.nodeName=--node through --server (bearer --token, server
// certificate not verified), registers each with both managers, reads every object each
// pod references (timing each pod's first complete read, which blocks until its
// reflectors synced; a read that fails is retried, as the kubelet's pod worker retries a
// pod's sync), then polls until every object's data.v equals --await-value and
// prints one JSON line: pods, objects, first-read percentiles (ms), the time until every
// pod saw --await-value, and the requests the managers made. Exit 0; 1 on timeout or error.
//
// Built by scripts/k8s/build-programs.sh; run by services/tests/kubelet.rs.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/kubernetes/pkg/kubelet/configmap"
	"k8s.io/kubernetes/pkg/kubelet/secret"

	"kcache.local/judges/judgelib"
)

type ref struct{ namespace, name string }

func refs(pod *corev1.Pod) (secrets, configMaps []string) {
	for _, v := range pod.Spec.Volumes {
		if v.Secret != nil {
			secrets = append(secrets, v.Secret.SecretName)
		}
		if v.ConfigMap != nil {
			configMaps = append(configMaps, v.ConfigMap.Name)
		}
	}
	return
}

func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(p * float64(len(sorted)-1))
	return sorted[i]
}

func main() {
	server := flag.String("server", "", "API server (or kcache) URL")
	token := flag.String("token", "", "bearer token (the node's)")
	node := flag.String("node", "node1", "node name")
	awaitValue := flag.String("await-value", "", "data.v every object must reach")
	timeout := flag.Duration("timeout", 300*time.Second, "give up after")
	flag.Parse()

	// As the kubelet: protobuf for built-in kinds.
	cfg, reqs := judgelib.Config(*server, *token, true)
	// Only the managers' requests count, not this program's list of the node's pods.
	reqs.Skip = func(req *http.Request) bool { return strings.HasSuffix(req.URL.Path, "/pods") }
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "client:", err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	pods, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + *node})
	if err != nil {
		fmt.Fprintln(os.Stderr, "listing the node's pods:", err)
		os.Exit(1)
	}
	secrets := secret.NewWatchingSecretManager(client, time.Minute)
	configMaps := configmap.NewWatchingConfigMapManager(client, time.Minute)
	start := time.Now()
	firstRead := make([]float64, len(pods.Items))
	var wg sync.WaitGroup
	var failed sync.Map
	var retries atomic.Int64
	objects := 0
	for i := range pods.Items {
		pod := &pods.Items[i]
		secrets.RegisterPod(pod)
		configMaps.RegisterPod(pod)
		s, c := refs(pod)
		objects += len(s) + len(c)
		wg.Add(1)
		go func(i int, pod *corev1.Pod, s, c []string) {
			defer wg.Done()
			// The managers' Get waits a second for the object's reflector to sync and
			// fails after that; the kubelet's pod worker then retries the pod's sync,
			// as this does, until the read succeeds or the run times out.
			get := func(kind, n string, read func() error) {
				for {
					err := read()
					if err == nil {
						return
					}
					retries.Add(1)
					if ctx.Err() != nil {
						failed.Store(kind+" "+pod.Namespace+"/"+n, err.Error())
						return
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
			for _, n := range s {
				get("secret", n, func() error { _, err := secrets.GetSecret(pod.Namespace, n); return err })
			}
			for _, n := range c {
				get("configmap", n, func() error { _, err := configMaps.GetConfigMap(pod.Namespace, n); return err })
			}
			firstRead[i] = float64(time.Since(start).Microseconds()) / 1000
		}(i, pod, s, c)
	}
	wg.Wait()
	failures := map[string]string{}
	failed.Range(func(k, v interface{}) bool { failures[k.(string)] = v.(string); return true })
	if len(failures) > 0 {
		fmt.Fprintln(os.Stderr, "first reads failed:", failures)
		os.Exit(1)
	}
	fmt.Printf("synced pods=%d objects=%d\n", len(pods.Items), objects)
	awaitStart := time.Now()
	for {
		pending := 0
		for i := range pods.Items {
			pod := &pods.Items[i]
			s, c := refs(pod)
			for _, n := range s {
				if o, err := secrets.GetSecret(pod.Namespace, n); err != nil || string(o.Data["v"]) != *awaitValue {
					pending++
				}
			}
			for _, n := range c {
				if o, err := configMaps.GetConfigMap(pod.Namespace, n); err != nil || o.Data["v"] != *awaitValue {
					pending++
				}
			}
		}
		if pending == 0 {
			break
		}
		select {
		case <-ctx.Done():
			fmt.Fprintf(os.Stderr, "timed out: %d objects not at %q\n", pending, *awaitValue)
			os.Exit(1)
		case <-time.After(50 * time.Millisecond):
		}
	}
	sort.Float64s(firstRead)
	summary := map[string]interface{}{
		"pods":           len(pods.Items),
		"objects":        objects,
		"firstReadP50ms": percentile(firstRead, 0.5),
		"firstReadP99ms": percentile(firstRead, 0.99),
		"firstReadMaxms": percentile(firstRead, 1),
		"readRetries":    retries.Load(),
		"awaitedMs":      float64(time.Since(awaitStart).Microseconds()) / 1000,
	}
	for k, v := range reqs.Counts() {
		summary[k] = v
	}
	out, _ := json.Marshal(summary)
	fmt.Println(string(out))
}
