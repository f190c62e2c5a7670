// Package natsinformer runs an unchanged client-go informer over NATS: a
// cache.ListerWatcher on kcache's subject contract (kcachenats), so a SharedInformer
// syncs and follows one kcache key without a connection to the API server.
//
//   - List is a snapshot from the key's owner (`<prefix>.snap.<key>`); the events that
//     follow it are kept for the Watch that comes next.
//   - Watch from the list's (or the last event's or bookmark's) resourceVersion continues
//     the same stream; heartbeats become bookmarks. Any other resourceVersion is 410
//     Expired, and the reflector lists again.
//   - A gap, a new owner (epoch) or a refused message ends the watch with a 410 error:
//     the reflector relists, which is a new snapshot.
//   - Streaming lists (client-go's default since 1.35: sendInitialEvents=true) are served
//     the same way: the snapshot's objects as ADDED events, then the bookmark annotated
//     `k8s.io/initial-events-end`, then the stream.
//
// Sealed bodies open with the key ring given (a read key: it cannot sign), and only
// messages signed by the fleet's public keys are taken (kcachenats.Opener).
package natsinformer

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"kcache.local/subscriber/kcachenats"
)

// Options say which key to follow and how to read it.
type Options struct {
	Conn *nats.Conn
	// Prefix is kcache's subject prefix ("kcache").
	Prefix string
	// Key is the key's six escaped tokens, e.g. "_.v1.configmaps.shop.all._".
	Key string
	// Opener checks signatures and opens seals (its Token is set to Key).
	Opener kcachenats.Opener
	// NewList and NewObject make the typed list and object the informer stores, e.g.
	// &corev1.ConfigMapList{} and &corev1.ConfigMap{}.
	NewList, NewObject func() runtime.Object
	// SnapshotRetry: an unanswered snapshot request is sent again after this long (2 s).
	SnapshotRetry time.Duration
	// ListTimeout: a List with no snapshot after this long fails (30 s; the reflector
	// retries with backoff).
	ListTimeout time.Duration
	// Buffer: messages held between a List and its Watch, and while a watch's consumer
	// is slow; past it NATS drops (a gap: 410, relist).
	Buffer int
}

// ListerWatcher is a cache.ListerWatcher over NATS.
type ListerWatcher struct {
	o  Options
	mu sync.Mutex
	// cur is the stream the last List (or streaming list) started; a Watch continues it.
	cur *stream
	// What was asked of it, for judges and logs.
	lists, streamingLists, watches, expired atomic.Int64
}

// Stats says how often the informer listed (snapshots), streamed a list, watched on, and
// was sent back to list (410: a gap, a new owner, an unknown resourceVersion).
func (l *ListerWatcher) Stats() map[string]int64 {
	return map[string]int64{
		"lists":          l.lists.Load(),
		"streamingLists": l.streamingLists.Load(),
		"watches":        l.watches.Load(),
		"expired":        l.expired.Load(),
	}
}

var _ cache.ListerWatcher = (*ListerWatcher)(nil)

// New checks the options and fills defaults.
func New(o Options) (*ListerWatcher, error) {
	if o.Conn == nil || o.NewList == nil || o.NewObject == nil {
		return nil, fmt.Errorf("natsinformer: Conn, NewList and NewObject are required")
	}
	if len(strings.Split(o.Key, ".")) != 6 {
		return nil, fmt.Errorf("natsinformer: %q is not a key (six escaped tokens)", o.Key)
	}
	if o.Prefix == "" {
		o.Prefix = "kcache"
	}
	if o.SnapshotRetry <= 0 {
		o.SnapshotRetry = 2 * time.Second
	}
	if o.ListTimeout <= 0 {
		o.ListTimeout = 30 * time.Second
	}
	if o.Buffer <= 0 {
		o.Buffer = 1 << 16
	}
	o.Opener.Token = o.Key
	return &ListerWatcher{o: o}, nil
}

// stream is one follow of the key: its subscriptions, session and position.
type stream struct {
	o       *Options
	nonce   string
	sess    *kcachenats.Session
	msgs    chan *nats.Msg
	subs    []*nats.Subscription
	started time.Time
	// pending: updates decided but not yet handed to a watch (those after a snapshot).
	pending []kcachenats.Update
	// reading is held by whoever consumes msgs (List, then one watch at a time); pending
	// and the session are only touched under it.
	reading sync.Mutex
	// mu guards lastRV: what a Watch may continue from (the snapshot's, the last event's
	// or bookmark's resourceVersion).
	mu     sync.Mutex
	lastRV string
	// done is closed with the stream: its watch ends with 410 (the reflector lists again).
	done      chan struct{}
	closeOnce sync.Once
}

func (s *stream) setRV(rv string) {
	s.mu.Lock()
	s.lastRV = rv
	s.mu.Unlock()
}

// continues says whether a Watch from rv continues this stream.
func (s *stream) continues(rv string) bool {
	select {
	case <-s.done:
		return false
	default:
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return rv != "" && rv == s.lastRV
}

func (l *ListerWatcher) subject(kind string) string {
	return l.o.Prefix + "." + kind + "." + l.o.Key
}

func (l *ListerWatcher) newStream() (*stream, error) {
	s := &stream{
		o:       &l.o,
		nonce:   strconv.FormatUint(uint64(time.Now().UnixNano()), 36),
		sess:    kcachenats.NewSession(l.o.Opener, uint64(10*l.o.SnapshotRetry/time.Millisecond), 10_000),
		msgs:    make(chan *nats.Msg, l.o.Buffer),
		started: time.Now(),
		done:    make(chan struct{}),
	}
	for _, subj := range []string{l.subject("ev"), l.subject("reply") + "." + s.nonce + ".*"} {
		sub, err := l.o.Conn.ChanSubscribe(subj, s.msgs)
		if err != nil {
			s.close()
			return nil, fmt.Errorf("natsinformer: subscribing to %s: %w", subj, err)
		}
		s.subs = append(s.subs, sub)
	}
	if err := l.o.Conn.FlushTimeout(10 * time.Second); err != nil {
		s.close()
		return nil, fmt.Errorf("natsinformer: flush: %w", err)
	}
	return s, nil
}

func (s *stream) close() {
	s.closeOnce.Do(func() {
		for _, sub := range s.subs {
			_ = sub.Unsubscribe()
		}
		close(s.done)
	})
}

func (s *stream) nowMs() uint64 { return uint64(time.Since(s.started) / time.Millisecond) }

func (s *stream) ask() error {
	n := s.sess.Ask()
	reply := fmt.Sprintf("%s.reply.%s.%s.%d", s.o.Prefix, s.o.Key, s.nonce, n)
	return s.o.Conn.PublishRequest(s.o.Prefix+".snap."+s.o.Key, reply, []byte("{}"))
}

// feed gives one message to the session.
func (s *stream) feed(m *nats.Msg) kcachenats.Step {
	via := kcachenats.ViaLive
	if strings.HasPrefix(m.Subject, s.o.Prefix+".reply.") {
		via = kcachenats.ViaReply
	}
	var get func(string) (string, bool)
	// A NATS status ("503": no responders) is no message of the contract's.
	if m.Header != nil && m.Header.Get("Status") == "" {
		get = func(n string) (string, bool) {
			v, ok := m.Header[n]
			if !ok || len(v) == 0 {
				return "", false
			}
			return v[0], true
		}
	}
	return s.sess.On(s.nowMs(), m.Subject, get, m.Data, via)
}

// snapshot asks for a snapshot and reads until it comes: its list and stamp.
func (l *ListerWatcher) snapshot(ctx context.Context) (*stream, runtime.Object, kcachenats.Stamp, error) {
	s, err := l.newStream()
	if err != nil {
		return nil, nil, kcachenats.Stamp{}, err
	}
	fail := func(err error) (*stream, runtime.Object, kcachenats.Stamp, error) {
		s.close()
		return nil, nil, kcachenats.Stamp{}, err
	}
	if err := s.ask(); err != nil {
		return fail(err)
	}
	lastAsk := time.Now()
	// Asks again, but not while an answer is arriving and not more than once a retry
	// period: a new request drops the answer in flight.
	again := func() error {
		if s.sess.Synced() || s.sess.AnswerArriving() || time.Since(lastAsk) < l.o.SnapshotRetry {
			return nil
		}
		lastAsk = time.Now()
		return s.ask()
	}
	deadline := time.NewTimer(l.o.ListTimeout)
	defer deadline.Stop()
	retry := time.NewTicker(l.o.SnapshotRetry)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return fail(ctx.Err())
		case <-deadline.C:
			return fail(apierrors.NewTimeoutError(fmt.Sprintf("no snapshot of %s over NATS in %s", l.o.Key, l.o.ListTimeout), 1))
		case <-retry.C:
			if err := again(); err != nil {
				return fail(err)
			}
		case m := <-s.msgs:
			step := s.feed(m)
			for i, u := range step.Updates {
				if u.Snapshot == nil {
					continue
				}
				list := l.o.NewList()
				if err := json.Unmarshal(u.Body, list); err != nil {
					return fail(fmt.Errorf("natsinformer: the snapshot of %s: %w", l.o.Key, err))
				}
				rv := strconv.FormatUint(u.Snapshot.RV, 10)
				if acc, err := meta.ListAccessor(list); err == nil {
					acc.SetResourceVersion(rv)
				}
				s.setRV(rv)
				s.pending = append(s.pending, step.Updates[i+1:]...)
				// Another answer to this request (an old owner and its successor may
				// both answer) is dropped from here on, not taken as a new state.
				s.sess.Ask()
				return s, list, *u.Snapshot, nil
			}
			if step.Resync {
				if err := again(); err != nil {
					return fail(err)
				}
			}
		}
	}
}

// Close ends the current stream (its NATS subscriptions); a running watch ends with 410.
func (l *ListerWatcher) Close() {
	l.replace(nil)
}

// List is a snapshot from the key's owner.
func (l *ListerWatcher) List(opts metav1.ListOptions) (runtime.Object, error) {
	return l.ListWithContext(context.Background(), opts)
}

// ListWithContext is List with a context.
func (l *ListerWatcher) ListWithContext(ctx context.Context, _ metav1.ListOptions) (runtime.Object, error) {
	l.lists.Add(1)
	s, list, _, err := l.snapshot(ctx)
	if err != nil {
		return nil, err
	}
	l.replace(s)
	return list, nil
}

func (l *ListerWatcher) replace(s *stream) {
	l.mu.Lock()
	old := l.cur
	l.cur = s
	l.mu.Unlock()
	if old != nil {
		old.close()
	}
}

// Watch continues the stream of the last List from its resourceVersion, or serves a
// streaming list.
func (l *ListerWatcher) Watch(opts metav1.ListOptions) (watch.Interface, error) {
	return l.WatchWithContext(context.Background(), opts)
}

// WatchWithContext is Watch with a context.
func (l *ListerWatcher) WatchWithContext(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	var initial []watch.Event
	var s *stream
	if opts.SendInitialEvents != nil && *opts.SendInitialEvents {
		l.streamingLists.Add(1)
		var list runtime.Object
		var stamp kcachenats.Stamp
		var err error
		s, list, stamp, err = l.snapshot(ctx)
		if err != nil {
			return nil, err
		}
		items, err := meta.ExtractList(list)
		if err != nil {
			s.close()
			return nil, err
		}
		for _, it := range items {
			initial = append(initial, watch.Event{Type: watch.Added, Object: it})
		}
		end := l.o.NewObject()
		if acc, err := meta.Accessor(end); err == nil {
			acc.SetResourceVersion(strconv.FormatUint(stamp.RV, 10))
			acc.SetAnnotations(map[string]string{metav1.InitialEventsAnnotationKey: "true"})
		}
		initial = append(initial, watch.Event{Type: watch.Bookmark, Object: end})
		l.replace(s)
	} else {
		l.mu.Lock()
		s = l.cur
		l.mu.Unlock()
		l.watches.Add(1)
		if s == nil || !s.continues(opts.ResourceVersion) {
			l.expired.Add(1)
			return nil, apierrors.NewResourceExpired(fmt.Sprintf("resourceVersion %q is not where the NATS stream of %s is: list again", opts.ResourceVersion, l.o.Key))
		}
	}
	w := &watcher{
		l:         l,
		s:         s,
		o:         &l.o,
		out:       make(chan watch.Event),
		stop:      make(chan struct{}),
		bookmarks: opts.AllowWatchBookmarks,
	}
	if opts.TimeoutSeconds != nil && *opts.TimeoutSeconds > 0 {
		w.timeout = time.Duration(*opts.TimeoutSeconds) * time.Second
	}
	go w.run(ctx, initial)
	return w, nil
}

type watcher struct {
	l         *ListerWatcher
	s         *stream
	o         *Options
	out       chan watch.Event
	stop      chan struct{}
	once      sync.Once
	bookmarks bool
	timeout   time.Duration
}

func (w *watcher) Stop()                          { w.once.Do(func() { close(w.stop) }) }
func (w *watcher) ResultChan() <-chan watch.Event { return w.out }

func (w *watcher) send(e watch.Event) bool {
	select {
	case w.out <- e:
		return true
	case <-w.stop:
		return false
	}
}

// expired ends the watch as the API server does when it cannot continue: the reflector
// lists again.
func (w *watcher) expired(why string) {
	w.l.expired.Add(1)
	st := apierrors.NewResourceExpired(why).Status()
	w.send(watch.Event{Type: watch.Error, Object: &st})
}

func (w *watcher) run(ctx context.Context, initial []watch.Event) {
	defer close(w.out)
	s := w.s
	s.reading.Lock()
	defer s.reading.Unlock()
	for _, e := range initial {
		if !w.send(e) {
			return
		}
	}
	var deadline <-chan time.Time
	if w.timeout > 0 {
		t := time.NewTimer(w.timeout)
		defer t.Stop()
		deadline = t.C
	}
	for {
		for len(s.pending) > 0 {
			u := s.pending[0]
			s.pending = s.pending[1:]
			if !w.apply(u) {
				return
			}
		}
		select {
		case <-w.stop:
			return
		case <-ctx.Done():
			return
		case <-deadline:
			return
		case <-s.done:
			// A List (or streaming list) replaced this stream, or Close.
			w.expired(fmt.Sprintf("the NATS stream of %s was replaced: list again", w.o.Key))
			return
		case m := <-s.msgs:
			step := s.feed(m)
			s.pending = append(s.pending, step.Updates...)
		}
	}
}

// apply hands one update to the reflector; false once the watch is over.
func (w *watcher) apply(u kcachenats.Update) bool {
	s := w.s
	switch {
	case u.Event != nil:
		var line struct {
			Type   watch.EventType `json:"type"`
			Object json.RawMessage `json:"object"`
		}
		obj := w.o.NewObject()
		if err := json.Unmarshal(u.Body, &line); err != nil || json.Unmarshal(line.Object, obj) != nil {
			s.close()
			w.expired(fmt.Sprintf("an unreadable event on %s: list again", w.o.Key))
			return false
		}
		if acc, err := meta.Accessor(obj); err == nil {
			s.setRV(acc.GetResourceVersion())
		}
		return w.send(watch.Event{Type: line.Type, Object: obj})
	case u.Progress != nil:
		rv := strconv.FormatUint(*u.Progress, 10)
		s.setRV(rv)
		if !w.bookmarks {
			return true
		}
		b := w.o.NewObject()
		if acc, err := meta.Accessor(b); err == nil {
			acc.SetResourceVersion(rv)
		}
		return w.send(watch.Event{Type: watch.Bookmark, Object: b})
	case u.Resync != "":
		// A gap or a new owner: this stream cannot continue; a relist takes a snapshot.
		s.close()
		w.expired(fmt.Sprintf("the NATS stream of %s needs a new snapshot (%s): list again", w.o.Key, u.Resync))
		return false
	case u.Snapshot != nil:
		// A state a watch cannot express as events (none is asked for in a watch; kept
		// safe all the same): list again.
		s.close()
		w.expired(fmt.Sprintf("a new state of %s arrived during a watch: list again", w.o.Key))
		return false
	default:
		// A refused message: the resync that follows ends the watch.
		return true
	}
}
