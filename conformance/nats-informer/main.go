// kcache-nats-informer: an unchanged client-go SharedInformer of the pinned Kubernetes
// version over NATS instead of the API server — natsinformer's ListerWatcher on one
// kcache key, streaming lists as client-go does them by default — reporting what it saw.
//
// It informs on one namespace's ConfigMaps (the key _.v1.configmaps.<namespace>.all._ of
// a kcache fleet with --nats, token --token-file, messages verified with the fleet's
// public key --verify-key, base64) and prints
//
//	synced N initial=<names in the first synced state, comma-separated>
//
// once it has synced, then waits until its store holds ConfigMap --await-name with
// data.v == --await-value and prints one JSON line: the store (name → data.v and
// resourceVersion), every object whose resourceVersion went back, and what the informer
// asked of NATS (lists, streaming lists, watches, 410s that sent it back to list). Exit 0
// then; 1 on timeout or error.
//
// Built by scripts/k8s/build-programs.sh; run by services/tests/nats_informer.rs.
package main

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/cache"

	"kcache.local/judges/judgelib"
	"kcache.local/subscriber/kcachenats"
	"kcache.local/subscriber/natsinformer"
)

func main() {
	url := flag.String("nats", "nats://127.0.0.1:4222", "NATS URL(s), comma-separated")
	tokenFile := flag.String("token-file", "", "a file holding the NATS token")
	verifyKey := flag.String("verify-key", "", "the fleet's Ed25519 public key, base64")
	prefix := flag.String("prefix", "kcache", "kcache's subject prefix")
	namespace := flag.String("namespace", "default", "namespace")
	awaitName := flag.String("await-name", "", "ConfigMap to wait for")
	awaitValue := flag.String("await-value", "", "its data.v to wait for")
	timeout := flag.Duration("timeout", 120*time.Second, "give up after")
	flag.Parse()

	fail := func(format string, a ...any) {
		fmt.Fprintf(os.Stderr, format+"\n", a...)
		os.Exit(1)
	}
	var opts []nats.Option
	if *tokenFile != "" {
		tok, err := os.ReadFile(*tokenFile)
		if err != nil {
			fail("token: %v", err)
		}
		opts = append(opts, nats.Token(strings.TrimSpace(string(tok))))
	}
	// Reconnect for as long as the run lasts: a NATS node restart is part of the test.
	opts = append(opts, nats.MaxReconnects(-1), nats.ReconnectWait(200*time.Millisecond))
	nc, err := nats.Connect(*url, opts...)
	if err != nil {
		fail("nats: %v", err)
	}
	var verify []ed25519.PublicKey
	if *verifyKey != "" {
		k, err := base64.StdEncoding.DecodeString(*verifyKey)
		if err != nil || len(k) != ed25519.PublicKeySize {
			fail("--verify-key is not a base64 Ed25519 public key")
		}
		verify = append(verify, ed25519.PublicKey(k))
	}
	lw, err := natsinformer.New(natsinformer.Options{
		Conn:      nc,
		Prefix:    *prefix,
		Key:       "_.v1.configmaps." + *namespace + ".all._",
		Opener:    kcachenats.Opener{Verify: verify},
		NewList:   func() runtime.Object { return &corev1.ConfigMapList{} },
		NewObject: func() runtime.Object { return &corev1.ConfigMap{} },
	})
	if err != nil {
		fail("%v", err)
	}
	inf := cache.NewSharedIndexInformer(lw, &corev1.ConfigMap{}, 0, cache.Indexers{})
	j := judgelib.NewNoGoingBack()
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    j.Saw,
		UpdateFunc: func(_, obj interface{}) { j.Saw(obj) },
	})
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	go inf.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		fail("not synced before the timeout")
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
			fail("timed out waiting for %s=%s", *awaitName, *awaitValue)
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
	went := j.Went()
	if went == nil {
		went = []string{}
	}
	out, _ := json.Marshal(map[string]interface{}{
		"objects":          objects,
		"resourceVersions": rvs,
		"wentBack":         went,
		"nats":             lw.Stats(),
	})
	fmt.Println(string(out))
}
