//! A watcher's mailbox: what its key sends it ([`ToWatcher`]), waiting until the watcher's
//! response body is next polled. The key holds a [`WatcherLink`], the watcher the
//! [`Mailbox`]; one `Arc` between them.
//!
//! Why not an actix mailbox: a watcher is driven by its response body's poll (the HTTP/2
//! stream's task polls it when the client can take more), so its messages need a queue and
//! a waker, not a task of their own. An actix actor's task, mailbox and address were about
//! 1 KB of every idle watch (issue 31.1); this is an `Arc`, a mutex and a `VecDeque` that
//! holds only what waits.
//!
//! The queue is also the client's buffer. A body that is not polled means the client is
//! not reading (HTTP/2 flow control), and live events queue here. Up to `buffer` of them
//! are a client a moment behind. Beyond that a live event waits at most what the
//! resource's dispatch budget gives it (the cacher's `dispatchTimeoutBudget`): the client
//! catching up within the wait keeps the watch and every event; one that does not is
//! *cut*: the events past `buffer` are dropped, and nothing that comes after them is ever
//! written (an event, a bookmark or a move past a gap would let the client resume beyond
//! events it never got). `mailbox` more events past `buffer` cut it at once. Messages that
//! are not events (a start, a replay, a close, a move) are otherwise always queued: the
//! key sends few, and each matters.
//!
//! The mailbox also keeps what the watch holds until it ends (its reference on its key,
//! its admission permit: [`Mailbox::keep`]), and lets go of it as soon as either side ends
//! the watch — the watcher, or the key closing or refusing it. A body stuck in HTTP/2 flow
//! control is not polled, and must not hold its key and its client's quota meanwhile.

use std::any::Any;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::core::event::StoreEvent;
use crate::dispatch_budget::DispatchBudget;
use crate::metrics as m;

use super::{CloseReason, ToWatcher};

/// A wait shorter than this is none: the budget refills continuously (50 µs a
/// millisecond), and a client cannot catch up in what a spent budget has regained a few
/// microseconds later.
const MIN_WAIT: Duration = Duration::from_millis(1);

/// Why a key's event was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// The client is not reading: the key closes the watch as too slow.
    #[error("the watcher's buffer is full: the client is not reading")]
    Full,
    /// The watcher has stopped; its `Unsubscribe` is on the way.
    #[error("the watcher has stopped")]
    Gone,
}

/// What the watcher takes from its mailbox.
pub enum Received {
    Msg(ToWatcher),
    /// The client did not catch up within its wait: every event it had room for has been
    /// taken; the watch ends as too slow.
    Cut,
}

/// What a watch holds until it ends (see [`Mailbox::keep`]).
pub type Kept = Box<dyn Any + Send>;

struct State {
    queue: VecDeque<ToWatcher>,
    /// Live events past `buffer` are waiting: since when, and for at most how long; boxed,
    /// as rare (an idle watch's size counts, issue 31.1).
    stall: Option<Box<(Instant, Duration)>>,
    /// The watcher, waiting for a message.
    waker: Option<Waker>,
    /// Cut: no event, bookmark or move is queued any more.
    cut: bool,
    /// The watcher noticed the cut itself (the key did not refuse an event): it counts the
    /// watch as terminated, and the key is answered `Gone`, not told to terminate it too.
    cut_by_watcher: bool,
    /// The watcher has yet to hear of a cut it noticed itself ([`Received::Cut`]).
    cut_untold: bool,
    gone: bool,
    kept: Option<Kept>,
}

struct Shared {
    state: Mutex<State>,
    buffer: usize,
    /// Most messages queued; events past it cut the watch.
    most: usize,
    budget: Arc<DispatchBudget>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every critical section is a few field updates: a poisoned lock is consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Cuts the watch: the events past `buffer` dropped, the wait's unused part given
    /// back, nothing more after them.
    fn cut(&self, st: &mut State) {
        cut_to(&mut st.queue, self.buffer);
        self.end_stall(st);
        st.cut = true;
    }

    /// Ends a wait for room, if one runs: what it did not use goes back to the others.
    fn end_stall(&self, st: &mut State) {
        if let Some((since, wait)) = st.stall.take().map(|s| *s) {
            self.budget.give_back(wait.saturating_sub(since.elapsed()));
        }
    }
}

/// A watcher as its key sees it: where to send its messages.
#[derive(Clone)]
pub struct WatcherLink(Arc<Shared>);

impl std::fmt::Debug for WatcherLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WatcherLink")
    }
}

/// The watcher's end (see the module's summary).
pub struct Mailbox(Arc<Shared>);

/// A watcher's mailbox and its link: `buffer` live events are a client a moment behind
/// (at least 1), `mailbox` more wait at most the `budget`'s time.
pub fn mailbox(
    buffer: usize,
    mailbox: usize,
    budget: Arc<DispatchBudget>,
) -> (Mailbox, WatcherLink) {
    let buffer = buffer.max(1);
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            queue: VecDeque::new(),
            stall: None,
            waker: None,
            cut: false,
            cut_by_watcher: false,
            cut_untold: false,
            gone: false,
            kept: None,
        }),
        buffer,
        most: buffer.saturating_add(mailbox.max(1)),
        budget,
    });
    (Mailbox(shared.clone()), WatcherLink(shared))
}

impl WatcherLink {
    /// Queues a message that is not an event: always, unless the watcher has stopped or
    /// was cut (then a close is still queued, a draining one without its bookmark). One
    /// that ends the watch (a close, a 410, a failure) lets go of what it kept at once.
    pub fn do_send(&self, msg: ToWatcher) {
        let mut st = self.0.lock();
        if st.gone {
            return;
        }
        let msg = match msg {
            ToWatcher::Close(CloseReason::Draining { .. }) if st.cut => {
                ToWatcher::Close(CloseReason::TooSlow)
            }
            ToWatcher::Dispatch(_)
            | ToWatcher::Bookmark { .. }
            | ToWatcher::Move(_)
            | ToWatcher::Start(_)
            | ToWatcher::Replay(_)
                if st.cut =>
            {
                return;
            }
            msg => msg,
        };
        let ends = matches!(
            msg,
            ToWatcher::Close(_) | ToWatcher::Expired { .. } | ToWatcher::Failed { .. }
        );
        push(&mut st.queue, msg);
        let kept = if ends { st.kept.take() } else { None };
        wake(st);
        drop(kept);
    }

    /// Queues a live event, unless the client is too far behind (see the module's
    /// summary).
    pub fn offer(&self, event: Arc<StoreEvent>) -> Result<(), Refused> {
        let mut st = self.0.lock();
        if st.gone {
            return Err(Refused::Gone);
        }
        if st.cut {
            return Err(match st.cut_by_watcher {
                true => Refused::Gone,
                false => Refused::Full,
            });
        }
        let queued = st.queue.len();
        if queued >= self.0.buffer {
            let out_of_time = match st.stall.as_deref() {
                _ if queued >= self.0.most => true,
                None => {
                    let wait = self.0.budget.take();
                    if wait < MIN_WAIT {
                        self.0.budget.give_back(wait);
                        metrics::counter!(m::DISPATCH_WAITS, "outcome" => "no_budget").increment(1);
                        return Err(self.refuse(st));
                    }
                    st.stall = Some(Box::new((Instant::now(), wait)));
                    false
                }
                Some(&(since, wait)) => since.elapsed() >= wait,
            };
            if out_of_time {
                metrics::counter!(m::DISPATCH_WAITS, "outcome" => "closed").increment(1);
                return Err(self.refuse(st));
            }
        }
        push(&mut st.queue, ToWatcher::Dispatch(event));
        wake(st);
        Ok(())
    }

    /// Queues a bookmark if the client's buffer has room; dropped otherwise, as the
    /// cacher's are: another comes, and a full buffer is no reason to close the watch.
    pub fn offer_bookmark(&self, rv: u64) {
        let mut st = self.0.lock();
        if st.gone || st.cut || st.queue.len() >= self.0.buffer {
            return;
        }
        push(&mut st.queue, ToWatcher::Bookmark { rv });
        wake(st);
    }

    /// The key refuses the event and closes the watch: what the client had room for is
    /// still written, nothing after it; what the watch kept is let go of now.
    fn refuse(&self, mut st: MutexGuard<'_, State>) -> Refused {
        self.0.cut(&mut st);
        let kept = st.kept.take();
        drop(st);
        drop(kept);
        Refused::Full
    }
}

impl Mailbox {
    /// The next message; `Pending` (and woken by the next) when none waits.
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Received> {
        let mut st = self.0.lock();
        let mut kept = None;
        if let Some(&(since, wait)) = st.stall.as_deref() {
            if since.elapsed() >= wait {
                // The wait ran out before the client caught up: the watch is over, though
                // its body may still write what the buffer held (and stall again doing so).
                metrics::counter!(m::DISPATCH_WAITS, "outcome" => "closed").increment(1);
                self.0.cut(&mut st);
                st.cut_by_watcher = true;
                st.cut_untold = true;
                kept = st.kept.take();
            }
        }
        if kept.is_some() {
            drop(st);
            drop(kept);
            st = self.0.lock();
        }
        let Some(msg) = st.queue.pop_front() else {
            if std::mem::take(&mut st.cut_untold) {
                return Poll::Ready(Received::Cut);
            }
            if !st.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                st.waker = Some(cx.waker().clone());
            }
            return Poll::Pending;
        };
        if st.stall.is_some() && st.queue.len() <= self.0.buffer {
            // Caught up within the wait (what waits fits in the buffer again).
            self.0.end_stall(&mut st);
            metrics::counter!(m::DISPATCH_WAITS, "outcome" => "caught_up").increment(1);
        }
        if st.queue.is_empty() {
            // A burst's slots, given back; an idle watch's queue holds none.
            st.queue = VecDeque::new();
        }
        Poll::Ready(Received::Msg(msg))
    }

    /// Another link to this mailbox (a key to subscribe to).
    pub fn link(&self) -> WatcherLink {
        WatcherLink(self.0.clone())
    }

    /// Live events the client's buffer has room for now.
    pub fn room(&self) -> usize {
        self.0.buffer.saturating_sub(self.0.lock().queue.len())
    }

    /// Keeps `kept` until the watch ends, whoever ends it (see the module's summary):
    /// dropped then, once.
    pub fn keep(&self, kept: Kept) {
        let old = self.0.lock().kept.replace(kept);
        drop(old);
    }

    /// What the watch keeps, while it is kept (`None` once either side ended the watch).
    pub fn kept<R>(&self, f: impl FnOnce(&mut Kept) -> R) -> Option<R> {
        self.0.lock().kept.as_mut().map(f)
    }

    /// The watcher stopped: what waits is freed, what it kept let go of, and nothing more
    /// is queued.
    pub fn close(&self) {
        let mut st = self.0.lock();
        st.gone = true;
        let queue = std::mem::take(&mut st.queue);
        st.waker = None;
        self.0.end_stall(&mut st);
        let kept = st.kept.take();
        drop(st);
        drop((queue, kept));
    }
}

impl Drop for Mailbox {
    fn drop(&mut self) {
        self.close();
    }
}

/// Queues `msg`; a first message takes one slot, not `VecDeque`'s four.
fn push(queue: &mut VecDeque<ToWatcher>, msg: ToWatcher) {
    if queue.capacity() == 0 {
        queue.reserve_exact(1);
    }
    queue.push_back(msg);
}

/// Wakes the watcher, after letting go of the lock.
fn wake(mut st: MutexGuard<'_, State>) {
    let waker = st.waker.take();
    drop(st);
    if let Some(w) = waker {
        w.wake();
    }
}

/// Keeps the first `buffer` messages; after them, only what ends the watch (a close, a
/// draining one made plain: its bookmark would claim the dropped events).
fn cut_to(queue: &mut VecDeque<ToWatcher>, buffer: usize) {
    if queue.len() <= buffer {
        return;
    }
    let rest: Vec<ToWatcher> = queue.drain(buffer..).collect();
    for msg in rest {
        match msg {
            ToWatcher::Close(CloseReason::Draining { .. }) => {
                queue.push_back(ToWatcher::Close(CloseReason::TooSlow))
            }
            msg @ (ToWatcher::Close(_) | ToWatcher::Expired { .. } | ToWatcher::Failed { .. }) => {
                queue.push_back(msg)
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::event::StoreEvent;
    use crate::core::object::{EventType, Object, Schema};
    use crate::watch_feed::CloseReason;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Count(AtomicUsize);
    impl futures::task::ArcWake for Count {
        fn wake_by_ref(me: &Arc<Self>) {
            me.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn event(rv: u64) -> Arc<StoreEvent> {
        let object = Object::from_value(
            Schema::Generic,
            &serde_json::json!({"metadata": {"name": "s", "namespace": "n", "resourceVersion": rv.to_string()}}),
        )
        .expect("a valid object");
        Arc::new(StoreEvent::new(
            rv,
            rv,
            EventType::Modified,
            Arc::new(object),
            None,
        ))
    }

    /// What the watcher takes now, as short strings: `e<rv>`, `b<rv>`, `close`, `cut`.
    fn take_all(mb: &mut Mailbox) -> Vec<String> {
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        let mut got = Vec::new();
        while let Poll::Ready(r) = mb.poll_recv(&mut cx) {
            got.push(match r {
                Received::Msg(ToWatcher::Dispatch(e)) => format!("e{}", e.rv),
                Received::Msg(ToWatcher::Bookmark { rv }) => format!("b{rv}"),
                Received::Msg(ToWatcher::Close(CloseReason::Draining { rv })) => {
                    format!("draining {rv}")
                }
                Received::Msg(ToWatcher::Close(_)) => "close".to_string(),
                Received::Msg(_) => "other".to_string(),
                Received::Cut => "cut".to_string(),
            });
        }
        got
    }

    fn budget(available: Duration) -> Arc<DispatchBudget> {
        Arc::new(DispatchBudget::with_available(available))
    }

    #[test]
    fn messages_arrive_in_order_and_wake_the_watcher() {
        let (mut mb, link) = mailbox(4, 4, budget(Duration::ZERO));
        let count = Arc::new(Count(AtomicUsize::new(0)));
        let waker = futures::task::waker(count.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(mb.poll_recv(&mut cx).is_pending());
        link.offer(event(2)).expect("queued");
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        link.offer_bookmark(3);
        link.do_send(ToWatcher::Close(CloseReason::KeyStopped));
        assert_eq!(take_all(&mut mb), ["e2", "b3", "close"]);
        assert_eq!(
            mb.0.lock().queue.capacity(),
            0,
            "an idle queue holds no slot"
        );
    }

    #[test]
    fn with_no_budget_a_full_buffer_refuses_at_once() {
        let (mut mb, link) = mailbox(2, 100, budget(Duration::ZERO));
        link.offer(event(2)).expect("queued");
        link.offer(event(3)).expect("queued");
        assert_eq!(link.offer(event(4)), Err(Refused::Full));
        // The key then closes the watch: after what the client had room for.
        link.do_send(ToWatcher::Close(CloseReason::TooSlow));
        assert_eq!(take_all(&mut mb), ["e2", "e3", "close"]);
    }

    #[test]
    fn a_client_that_reads_within_its_wait_has_caught_up() {
        let (mut mb, link) = mailbox(2, 100, budget(Duration::from_millis(100)));
        for rv in 2..=4 {
            link.offer(event(rv)).expect("queued");
        }
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        assert!(mb.poll_recv(&mut cx).is_ready());
        // What waits fits in the buffer again: no wait runs, the watch keeps every event.
        assert!(mb.0.lock().stall.is_none());
        std::thread::sleep(Duration::from_millis(150));
        assert_eq!(take_all(&mut mb), ["e3", "e4"]);
    }

    #[test]
    fn after_a_refusal_every_event_is_refused() {
        let (mut mb, link) = mailbox(2, 100, budget(Duration::ZERO));
        link.offer(event(2)).expect("queued");
        link.offer(event(3)).expect("queued");
        assert_eq!(link.offer(event(4)), Err(Refused::Full));
        // The key's next offer of the same input, before it closes the watch.
        assert_eq!(link.offer(event(5)), Err(Refused::Full));
        link.offer_bookmark(6);
        // A draining close would write a bookmark past the dropped events: a plain one.
        link.do_send(ToWatcher::Close(CloseReason::Draining { rv: 6 }));
        assert_eq!(take_all(&mut mb), ["e2", "e3", "close"]);
    }

    #[test]
    fn a_cut_the_watcher_noticed_is_for_good_too() {
        let (mut mb, link) = mailbox(2, 100, budget(Duration::from_millis(20)));
        for rv in 2..=4 {
            link.offer(event(rv)).expect("queued");
        }
        std::thread::sleep(Duration::from_millis(40));
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        assert!(matches!(
            mb.poll_recv(&mut cx),
            Poll::Ready(Received::Msg(ToWatcher::Dispatch(_)))
        ));
        // Nothing after the dropped event, though the buffer has room again; the watcher
        // ends the watch itself (and counts it), so the key is answered as by a stopped one.
        assert_eq!(link.offer(event(5)), Err(Refused::Gone));
        link.offer_bookmark(6);
        assert_eq!(take_all(&mut mb), ["e3", "cut"]);
    }

    #[test]
    fn a_cut_drops_a_draining_close_s_bookmark_and_keeps_a_close() {
        let (mut mb, link) = mailbox(1, 100, budget(Duration::from_millis(20)));
        link.offer(event(2)).expect("queued");
        link.offer(event(3)).expect("queued");
        link.do_send(ToWatcher::Close(CloseReason::Draining { rv: 3 }));
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(take_all(&mut mb), ["e2", "close", "cut"]);
    }

    /// Counts its drops.
    struct Dropped(Arc<AtomicUsize>);
    impl Drop for Dropped {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn what_the_watch_kept_goes_once_whichever_side_ends_it() {
        type End = fn(&WatcherLink);
        let ends: [(&str, End); 3] = [
            ("the key closes it", |l| {
                l.do_send(ToWatcher::Close(CloseReason::KeyStopped))
            }),
            ("the key refuses an event", |l| {
                for rv in 2..=4 {
                    let _ = l.offer(event(rv));
                }
            }),
            ("a 410", |l| {
                l.do_send(ToWatcher::Expired {
                    requested: 1,
                    oldest: 2,
                })
            }),
        ];
        for (how, end) in ends {
            let count = Arc::new(AtomicUsize::new(0));
            let (mb, link) = mailbox(2, 100, budget(Duration::ZERO));
            mb.keep(Box::new(Dropped(count.clone())));
            link.offer_bookmark(1);
            assert_eq!(count.load(Ordering::SeqCst), 0, "{how}: kept while it runs");
            end(&link);
            assert_eq!(count.load(Ordering::SeqCst), 1, "{how}: let go at once");
            assert!(mb.kept(|_| ()).is_none(), "{how}");
            drop(mb);
            assert_eq!(count.load(Ordering::SeqCst), 1, "{how}: once");
        }
        // The wait running out, noticed by the watcher: let go of before the rest is read.
        let count = Arc::new(AtomicUsize::new(0));
        let (mut mb, link) = mailbox(1, 100, budget(Duration::from_millis(20)));
        mb.keep(Box::new(Dropped(count.clone())));
        link.offer(event(2)).expect("queued");
        link.offer(event(3)).expect("queued");
        std::thread::sleep(Duration::from_millis(40));
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        assert!(mb.poll_recv(&mut cx).is_ready());
        assert_eq!(
            count.load(Ordering::SeqCst),
            1,
            "the wait ran out: let go at once"
        );
        drop(mb);
        assert_eq!(count.load(Ordering::SeqCst), 1, "once");
        // The watcher ending it.
        let count = Arc::new(AtomicUsize::new(0));
        let (mb, _link) = mailbox(2, 100, budget(Duration::ZERO));
        mb.keep(Box::new(Dropped(count.clone())));
        drop(mb);
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn a_bookmark_needs_room_in_the_buffer() {
        let (mut mb, link) = mailbox(2, 100, budget(Duration::ZERO));
        link.offer(event(2)).expect("queued");
        link.offer(event(3)).expect("queued");
        link.offer_bookmark(4);
        assert_eq!(take_all(&mut mb), ["e2", "e3"]);
        link.offer_bookmark(5);
        assert_eq!(take_all(&mut mb), ["b5"]);
    }

    #[test]
    fn a_client_a_moment_behind_keeps_every_event() {
        let b = budget(Duration::from_millis(100));
        let (mut mb, link) = mailbox(2, 100, b.clone());
        for rv in 2..=5 {
            link.offer(event(rv)).expect("queued");
        }
        assert!(mb.0.lock().stall.is_some());
        assert_eq!(take_all(&mut mb), ["e2", "e3", "e4", "e5"]);
        assert!(mb.0.lock().stall.is_none());
        // The wait it did not use went back: the next stall gets it again.
        assert!(b.take() > Duration::from_millis(90));
    }

    #[test]
    fn a_client_that_does_not_catch_up_within_its_wait_is_cut() {
        let (mut mb, link) = mailbox(2, 100, budget(Duration::from_millis(20)));
        for rv in 2..=4 {
            link.offer(event(rv)).expect("queued");
        }
        std::thread::sleep(Duration::from_millis(40));
        // Noticed when the watcher next reads: what the buffer held, then the cut.
        assert_eq!(take_all(&mut mb), ["e2", "e3", "cut"]);
    }

    #[test]
    fn an_event_after_the_wait_ran_out_is_refused_and_what_overflowed_dropped() {
        let (mut mb, link) = mailbox(2, 100, budget(Duration::from_millis(20)));
        for rv in 2..=4 {
            link.offer(event(rv)).expect("queued");
        }
        link.do_send(ToWatcher::Close(CloseReason::Resync));
        std::thread::sleep(Duration::from_millis(40));
        assert_eq!(link.offer(event(5)), Err(Refused::Full));
        // Messages that are not events survive the cut.
        assert_eq!(take_all(&mut mb), ["e2", "e3", "close"]);
    }

    #[test]
    fn events_past_the_mailbox_are_refused_even_within_the_wait() {
        let (_mb, link) = mailbox(2, 3, budget(Duration::from_millis(100)));
        for rv in 2..=6 {
            link.offer(event(rv)).expect("queued");
        }
        assert_eq!(link.offer(event(7)), Err(Refused::Full));
    }

    #[test]
    fn a_stopped_watcher_takes_nothing_more_and_frees_what_waited() {
        let (mb, link) = mailbox(2, 2, budget(Duration::ZERO));
        link.offer(event(2)).expect("queued");
        let weak = match mb.0.lock().queue.front() {
            Some(ToWatcher::Dispatch(e)) => Arc::downgrade(e),
            _ => panic!("an event waits"),
        };
        drop(mb);
        assert!(weak.upgrade().is_none(), "the waiting event was freed");
        assert_eq!(link.offer(event(3)), Err(Refused::Gone));
        link.do_send(ToWatcher::Close(CloseReason::KeyStopped));
    }

    #[test]
    fn room_is_what_the_buffer_has_left() {
        let (mb, link) = mailbox(3, 3, budget(Duration::ZERO));
        assert_eq!(mb.room(), 3);
        link.offer(event(2)).expect("queued");
        assert_eq!(mb.room(), 2);
        let (mb, _link) = mailbox(0, 0, budget(Duration::ZERO));
        assert_eq!(mb.room(), 1, "a buffer of 0 still carries one event");
    }
}
