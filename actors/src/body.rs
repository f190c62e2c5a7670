//! The bounded line queue between a `Watcher` and its HTTP response body.
//!
//! One exists per downstream watch and most of them sit idle for hours, so its idle size
//! matters more than its throughput: tokio's `mpsc` pre-allocates a 32-slot block plus
//! cache-padded heads (about 1.5 KB per channel); this one is an `Arc` and a `VecDeque`
//! that only holds what is queued, giving a burst's capacity back once it drains.
//!
//! There is one sender (the watcher) and one receiver (the body). For live events the
//! sender never waits: a full queue means the client stopped reading, and the watcher
//! closes it (the API server's cacheWatcher does the same). Initial events and replays are
//! written at the client's pace instead: the watcher writes while [`Sender::room`] allows
//! and awaits [`Sender::writable`] in between. [`Closed`] lets the watcher notice a client
//! that went away even when it has nothing to write.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use futures::Stream;

/// Why a line was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("the body queue is full: the client is not reading")]
    Full,
    #[error("the body is gone: the client went away")]
    Closed,
}

/// A queue that drained keeps at most this many slots: one, as an idle watch gets a line at
/// a time (a keepalive, an event) and most watches are idle. A first push would otherwise
/// allocate four (`VecDeque`'s smallest growth), ~100 bytes more for each idle watch.
const IDLE_SLOTS: usize = 1;

struct State {
    queue: VecDeque<Bytes>,
    capacity: usize,
    /// The body, waiting for a line.
    reader: Option<Waker>,
    /// Someone waiting for the body to go away.
    closed_waiter: Option<Waker>,
    /// The sender, waiting for room.
    writer: Option<Waker>,
    sender_gone: bool,
    body_gone: bool,
}

struct Shared(Mutex<State>);

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock leaves the queue consistent (every critical
        // section is a few field updates), so a poisoned lock is still usable.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A queue of at most `capacity` lines (at least 1).
pub fn channel(capacity: usize) -> (Sender, Body) {
    let shared = Arc::new(Shared(Mutex::new(State {
        queue: VecDeque::new(),
        capacity: capacity.max(1),
        reader: None,
        closed_waiter: None,
        writer: None,
        sender_gone: false,
        body_gone: false,
    })));
    (Sender(shared.clone()), Body(shared))
}

/// The watcher's end.
pub struct Sender(Arc<Shared>);

impl Sender {
    /// Queues `line` without waiting.
    pub fn try_send(&self, line: Bytes) -> Result<(), Error> {
        let mut st = self.0.lock();
        if st.body_gone {
            return Err(Error::Closed);
        }
        if st.queue.len() >= st.capacity {
            return Err(Error::Full);
        }
        if st.queue.capacity() == 0 {
            st.queue.reserve_exact(IDLE_SLOTS);
        }
        st.queue.push_back(line);
        let reader = st.reader.take();
        drop(st);
        if let Some(w) = reader {
            w.wake();
        }
        Ok(())
    }

    /// Resolves when the body is dropped (the client went away or the response ended).
    pub fn closed(&self) -> Closed {
        Closed(self.0.clone())
    }

    /// Lines that can be queued now without [`Error::Full`] (0 once the body is gone).
    pub fn room(&self) -> usize {
        let st = self.0.lock();
        if st.body_gone {
            return 0;
        }
        st.capacity.saturating_sub(st.queue.len())
    }

    /// Resolves once a line can be queued, or the body is gone (then `try_send` says
    /// `Closed`).
    pub fn writable(&self) -> Writable {
        Writable(self.0.clone())
    }
}

/// See [`Sender::writable`].
pub struct Writable(Arc<Shared>);

impl Future for Writable {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut st = self.0.lock();
        if st.body_gone || st.queue.len() < st.capacity {
            return Poll::Ready(());
        }
        if !st.writer.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            st.writer = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        let mut st = self.0.lock();
        st.sender_gone = true;
        let reader = st.reader.take();
        drop(st);
        if let Some(w) = reader {
            w.wake();
        }
    }
}

/// See [`Sender::closed`].
pub struct Closed(Arc<Shared>);

impl Future for Closed {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut st = self.0.lock();
        if st.body_gone {
            return Poll::Ready(());
        }
        if !st
            .closed_waiter
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            st.closed_waiter = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

/// The response body's end: the queued lines, ending when the sender is dropped.
pub struct Body(Arc<Shared>);

impl Stream for Body {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut st = self.0.lock();
        if let Some(line) = st.queue.pop_front() {
            if st.queue.is_empty() && st.queue.capacity() > IDLE_SLOTS {
                st.queue.shrink_to(IDLE_SLOTS);
            }
            let writer = st.writer.take();
            drop(st);
            if let Some(w) = writer {
                w.wake();
            }
            return Poll::Ready(Some(Ok(line)));
        }
        if st.sender_gone {
            return Poll::Ready(None);
        }
        if !st.reader.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            st.reader = Some(cx.waker().clone());
        }
        Poll::Pending
    }
}

impl Drop for Body {
    fn drop(&mut self) {
        let mut st = self.0.lock();
        st.body_gone = true;
        // Lines nobody will read: free them now, not when the watcher stops.
        st.queue = VecDeque::new();
        let waiter = st.closed_waiter.take();
        let writer = st.writer.take();
        drop(st);
        for w in [waiter, writer].into_iter().flatten() {
            w.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::task::noop_waker;
    use futures::StreamExt;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Count(AtomicUsize);
    impl futures::task::ArcWake for Count {
        fn wake_by_ref(me: &Arc<Self>) {
            me.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counting_waker() -> (Arc<Count>, Waker) {
        let c = Arc::new(Count(AtomicUsize::new(0)));
        (c.clone(), futures::task::waker(c))
    }

    #[test]
    fn lines_arrive_in_order_and_the_body_ends_with_the_sender() {
        let (tx, mut body) = channel(4);
        tx.try_send(Bytes::from_static(b"a\n")).unwrap();
        tx.try_send(Bytes::from_static(b"b\n")).unwrap();
        drop(tx);
        let got: Vec<_> = futures::executor::block_on(async {
            let mut v = Vec::new();
            while let Some(Ok(l)) = body.next().await {
                v.push(l);
            }
            v
        });
        assert_eq!(
            got,
            [Bytes::from_static(b"a\n"), Bytes::from_static(b"b\n")]
        );
    }

    #[test]
    fn a_full_queue_refuses_until_the_body_reads() {
        let (tx, mut body) = channel(2);
        tx.try_send(Bytes::from_static(b"1")).unwrap();
        tx.try_send(Bytes::from_static(b"2")).unwrap();
        assert_eq!(tx.try_send(Bytes::from_static(b"3")), Err(Error::Full));
        let mut cx = Context::from_waker(futures::task::noop_waker_ref());
        assert!(matches!(
            Pin::new(&mut body).poll_next(&mut cx),
            Poll::Ready(Some(Ok(_)))
        ));
        assert_eq!(tx.try_send(Bytes::from_static(b"3")), Ok(()));
    }

    #[test]
    fn a_waiting_body_is_woken_by_a_line_and_by_the_end() {
        let (tx, mut body) = channel(2);
        let (count, waker) = counting_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut body).poll_next(&mut cx).is_pending());
        tx.try_send(Bytes::from_static(b"x")).unwrap();
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert!(matches!(
            Pin::new(&mut body).poll_next(&mut cx),
            Poll::Ready(Some(Ok(_)))
        ));
        assert!(Pin::new(&mut body).poll_next(&mut cx).is_pending());
        drop(tx);
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
        assert!(matches!(
            Pin::new(&mut body).poll_next(&mut cx),
            Poll::Ready(None)
        ));
    }

    #[test]
    fn dropping_the_body_closes_the_sender_and_wakes_closed() {
        let (tx, body) = channel(2);
        let mut closed = tx.closed();
        let (count, waker) = counting_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut closed).poll(&mut cx).is_pending());
        tx.try_send(Bytes::from_static(b"unread")).unwrap();
        drop(body);
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert!(Pin::new(&mut closed).poll(&mut cx).is_ready());
        assert_eq!(tx.try_send(Bytes::from_static(b"x")), Err(Error::Closed));
    }

    #[test]
    fn a_drained_queue_gives_back_a_burst_s_slots() {
        let (tx, mut body) = channel(1000);
        for _ in 0..500 {
            tx.try_send(Bytes::from_static(b"x")).unwrap();
        }
        assert!(body.0.lock().queue.capacity() >= 500);
        let waker = noop_waker();
        let mut cx = Context::from_waker(&waker);
        while let Poll::Ready(Some(_)) = Pin::new(&mut body).poll_next(&mut cx) {}
        assert!(body.0.lock().queue.capacity() <= IDLE_SLOTS);
    }

    #[test]
    fn an_idle_queue_holds_one_slot() {
        let (tx, mut body) = channel(1000);
        assert_eq!(body.0.lock().queue.capacity(), 0);
        tx.try_send(Bytes::from_static(b"\n")).unwrap();
        assert_eq!(body.0.lock().queue.capacity(), IDLE_SLOTS);
        let waker = noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut body).poll_next(&mut cx).is_ready());
        tx.try_send(Bytes::from_static(b"\n")).unwrap();
        assert_eq!(body.0.lock().queue.capacity(), IDLE_SLOTS);
    }

    #[test]
    fn a_writer_waiting_for_room_is_woken_by_a_read_and_by_the_end() {
        let (tx, mut body) = channel(2);
        tx.try_send(Bytes::from_static(b"1")).unwrap();
        assert_eq!(tx.room(), 1);
        tx.try_send(Bytes::from_static(b"2")).unwrap();
        assert_eq!(tx.room(), 0);
        let (count, waker) = counting_waker();
        let mut cx = Context::from_waker(&waker);
        let mut writable = tx.writable();
        assert!(Pin::new(&mut writable).poll(&mut cx).is_pending());
        let mut rcx = Context::from_waker(futures::task::noop_waker_ref());
        assert!(matches!(
            Pin::new(&mut body).poll_next(&mut rcx),
            Poll::Ready(Some(Ok(_)))
        ));
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
        assert!(Pin::new(&mut writable).poll(&mut cx).is_ready());
        assert_eq!(tx.room(), 1);
        tx.try_send(Bytes::from_static(b"3")).unwrap();
        let mut writable = tx.writable();
        assert!(Pin::new(&mut writable).poll(&mut cx).is_pending());
        drop(body);
        assert_eq!(count.0.load(Ordering::SeqCst), 2);
        assert!(Pin::new(&mut writable).poll(&mut cx).is_ready());
        assert_eq!(tx.room(), 0);
    }

    #[test]
    fn capacity_zero_still_carries_one_line() {
        let (tx, _body) = channel(0);
        assert_eq!(tx.try_send(Bytes::from_static(b"x")), Ok(()));
        assert_eq!(tx.try_send(Bytes::from_static(b"y")), Err(Error::Full));
    }
}
