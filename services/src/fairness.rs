//! Fair shares of cache-served work. Requests the cache answers never meet the API
//! server's priority and fairness, so kcache gives them its own: a replica has a number of
//! seats (requests served from the cache at once); while they are all taken, each user
//! waits in a queue of their own and freed seats go to the waiting users in turn, as the
//! API server's fair queuing serves its flows. One user sending thousands of reads a
//! second fills their own queue, not everyone's: past it, or after waiting too long, the
//! answer is 429 with `Retry-After`, counted in `kcache_cache_requests_rejected_total`.
//! All queues together hold at most `server.cache_queue_total` requests, so that many
//! identities cannot make the waiting requests unbounded.
//!
//! A seat is taken after authentication (a flow is a user) and before authorization, where
//! the API server's filter sits; it is held while the cache works on the request: a get's
//! or list's whole answer (a list's body is written as the seat is held), a watch's start
//! (a watch's life is bounded by the watch caps, `crate::limits`, instead). A request that
//! only waits — for a key's first sync, a resourceVersion the key has not reached, a
//! freshness proof — gives its seat back meanwhile and queues for one again after
//! ([`SeatSlot`]): waiting is not work, and a start storm of new keys must not hold every
//! seat idle.

use kcache_actors::core::go_quote::go_quote;
use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::limits::too_many_requests;
use crate::status::ApiError;

/// Cache-served requests refused with 429, by `reason` (`queue_full`, `all_queues_full`,
/// `timeout`).
pub const REJECTED: &str = "kcache_cache_requests_rejected_total";
/// Cache-served requests waiting for a seat.
pub const WAITING: &str = "kcache_cache_requests_waiting";
/// Seats taken.
pub const SEATS_BUSY: &str = "kcache_cache_seats_busy";

/// Describes the metrics and registers every series at zero.
pub fn describe() {
    metrics::describe_counter!(
        REJECTED,
        "Cache-served requests refused with 429: their user's queue was full (queue_full), every queue together held server.cache_queue_total (all_queues_full), or they waited longer than server.cache_queue_wait_secs (timeout)."
    );
    metrics::describe_gauge!(WAITING, "Cache-served requests waiting for a seat.");
    metrics::describe_gauge!(
        SEATS_BUSY,
        "Seats taken by cache-served requests (of server.cache_seats)."
    );
    for reason in ["queue_full", "all_queues_full", "timeout"] {
        metrics::counter!(REJECTED, "reason" => reason).increment(0);
    }
    metrics::gauge!(WAITING).set(0.0);
    metrics::gauge!(SEATS_BUSY).set(0.0);
}

/// A request waiting for a seat.
pub type Ticket = u64;

/// What the queues ask of their caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// The ticket has a seat: serve it.
    Seat(Ticket),
    /// Its user's queue is full: 429.
    Refuse(Ticket),
    /// Every queue together is full (`total_limit`): 429.
    RefuseAll(Ticket),
    /// Queued: it waits for a seat.
    Wait(Ticket),
}

/// The seats and the users' queues: fair queuing without clocks or channels.
#[derive(Debug)]
pub struct Queues<F> {
    seats: usize,
    queue_limit: usize,
    /// Most requests waiting in all queues together (0: no bound).
    total_limit: usize,
    total_waiting: usize,
    busy: usize,
    waiting: HashMap<F, VecDeque<Ticket>>,
    /// Users with requests waiting, in the order they get the next seats.
    turn: VecDeque<F>,
}

impl<F: Hash + Eq + Clone> Queues<F> {
    /// `seats` requests at once (at least one); at most `queue_limit` waiting per user and
    /// `total_limit` in all (0: no bound).
    pub fn new(seats: usize, queue_limit: usize, total_limit: usize) -> Self {
        Queues {
            seats: seats.max(1),
            queue_limit,
            total_limit,
            total_waiting: 0,
            busy: 0,
            waiting: HashMap::new(),
            turn: VecDeque::new(),
        }
    }

    /// A request of `flow` arrives.
    pub fn arrive(&mut self, flow: &F, ticket: Ticket) -> Effect {
        // Nobody waits while a seat is free (a freed seat goes to the next waiter at once),
        // so a free seat is this request's.
        if self.busy < self.seats && self.turn.is_empty() {
            self.busy += 1;
            return Effect::Seat(ticket);
        }
        if self.total_limit > 0 && self.total_waiting >= self.total_limit {
            return Effect::RefuseAll(ticket);
        }
        let queue = self.waiting.entry(flow.clone()).or_default();
        if queue.len() >= self.queue_limit {
            if queue.is_empty() {
                self.waiting.remove(flow);
            }
            return Effect::Refuse(ticket);
        }
        queue.push_back(ticket);
        if queue.len() == 1 {
            self.turn.push_back(flow.clone());
        }
        self.total_waiting += 1;
        Effect::Wait(ticket)
    }

    /// A seat is freed: the next user in turn gets it for their oldest request.
    pub fn finish(&mut self) -> Option<Ticket> {
        self.busy = self.busy.saturating_sub(1);
        let flow = self.turn.pop_front()?;
        let queue = self.waiting.get_mut(&flow)?;
        let ticket = queue.pop_front()?;
        self.total_waiting -= 1;
        if queue.is_empty() {
            self.waiting.remove(&flow);
        } else {
            self.turn.push_back(flow);
        }
        self.busy += 1;
        Some(ticket)
    }

    /// A waiting request gave up (timed out, or its client left): `true` when it was still
    /// waiting, `false` when it already had a seat (which its caller must free).
    pub fn abandon(&mut self, flow: &F, ticket: Ticket) -> bool {
        let Some(queue) = self.waiting.get_mut(flow) else {
            return false;
        };
        let Some(i) = queue.iter().position(|t| *t == ticket) else {
            return false;
        };
        queue.remove(i);
        self.total_waiting -= 1;
        if queue.is_empty() {
            self.waiting.remove(flow);
            self.turn.retain(|f| f != flow);
        }
        true
    }

    pub fn busy(&self) -> usize {
        self.busy
    }

    pub fn waiting(&self) -> usize {
        self.total_waiting
    }
}

struct Shared {
    queues: Queues<String>,
    next_ticket: Ticket,
    /// How each waiting request hears it has a seat.
    wake: HashMap<Ticket, oneshot::Sender<()>>,
}

impl Shared {
    fn gauges(&self) {
        metrics::gauge!(SEATS_BUSY).set(self.queues.busy() as f64);
        metrics::gauge!(WAITING).set(self.wake.len() as f64);
    }

    /// Frees a seat, handing it on to the next waiter in turn. A waiter whose future is
    /// being dropped as the seat comes frees it again (`Waiting`'s drop): exactly once.
    fn free(&mut self) {
        if let Some(t) = self.queues.finish() {
            if let Some(tx) = self.wake.remove(&t) {
                let _ = tx.send(());
            }
        }
        self.gauges();
    }
}

/// The replica's seats for cache-served requests.
#[derive(Clone)]
pub struct Fairness {
    // A std lock held for a few instructions, never across an await.
    shared: Arc<Mutex<Shared>>,
    max_wait: Duration,
}

/// A seat: freed when dropped.
pub struct Seat {
    shared: Arc<Mutex<Shared>>,
}

/// A request's seat, which it gives back while it only waits (a key's first sync, a wait
/// for a resourceVersion, a freshness proof: up to tens of seconds with nothing to do) and
/// queues for again ([`SeatSlot::back`]) only once the cache has work for it: a request
/// whose wait ends in forwarding it upstream needs no seat.
pub struct SeatSlot<'a> {
    fairness: &'a Fairness,
    user: &'a str,
    seat: Option<Seat>,
    /// The seat was given back for a wait ([`SeatSlot::back`] takes one again).
    gave_back: bool,
}

impl<'a> SeatSlot<'a> {
    pub fn new(fairness: &'a Fairness, user: &'a str, seat: Option<Seat>) -> Self {
        SeatSlot {
            fairness,
            user,
            seat,
            gave_back: false,
        }
    }

    /// Runs `wait` without the seat (it is given back first).
    pub async fn away<T>(&mut self, wait: impl std::future::Future<Output = T>) -> T {
        if self.seat.take().is_some() {
            self.gave_back = true;
        }
        wait.await
    }

    /// Queues for the seat given back, before the cache works on the request again: 429
    /// as any request when none comes.
    pub async fn back(&mut self) -> Result<(), ApiError> {
        if self.gave_back && self.seat.is_none() {
            self.seat = Some(self.fairness.seat(self.user).await?);
            self.gave_back = false;
        }
        Ok(())
    }

    /// The seat, for an answer's body to hold until written.
    pub fn into_seat(self) -> Option<Seat> {
        self.seat
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        // A poisoned lock (a panic elsewhere while it was held) still counts its seats.
        let mut s = self
            .shared
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        s.free();
    }
}

/// A request in a queue; leaving it (a drop before the seat came) takes it out.
struct Waiting {
    shared: Arc<Mutex<Shared>>,
    user: String,
    ticket: Ticket,
    seated: bool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.seated {
            return;
        }
        let mut s = self
            .shared
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        s.wake.remove(&self.ticket);
        if !s.queues.abandon(&self.user, self.ticket) {
            // The seat came as it gave up: nobody will use it.
            s.free();
        }
        s.gauges();
    }
}

impl Fairness {
    /// `seats` cache-served requests at once, `queue_limit` waiting per user and
    /// `total_limit` in all (0: no bound), each for at most `max_wait`.
    pub fn new(seats: usize, queue_limit: usize, total_limit: usize, max_wait: Duration) -> Self {
        Fairness {
            shared: Arc::new(Mutex::new(Shared {
                queues: Queues::new(seats, queue_limit, total_limit),
                next_ticket: 0,
                wake: HashMap::new(),
            })),
            max_wait,
        }
    }

    /// A seat for a request of `user`, when their turn comes; 429 when their queue is full
    /// or the wait is too long.
    pub async fn seat(&self, user: &str) -> Result<Seat, ApiError> {
        let (ticket, rx) = {
            let mut s = self
                .shared
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let ticket = s.next_ticket;
            s.next_ticket += 1;
            match s.queues.arrive(&user.to_string(), ticket) {
                Effect::Seat(_) => {
                    s.gauges();
                    return Ok(Seat {
                        shared: self.shared.clone(),
                    });
                }
                Effect::Refuse(_) => {
                    metrics::counter!(REJECTED, "reason" => "queue_full").increment(1);
                    return Err(too_many_requests(format!(
                        "too many requests from user {} waiting for this kcache replica's cache; please try again later",
                        go_quote(user)
                    )));
                }
                Effect::RefuseAll(_) => {
                    metrics::counter!(REJECTED, "reason" => "all_queues_full").increment(1);
                    return Err(too_many_requests(
                        "too many requests waiting for this kcache replica's cache; please try again later"
                            .to_string(),
                    ));
                }
                Effect::Wait(_) => {
                    let (tx, rx) = oneshot::channel();
                    s.wake.insert(ticket, tx);
                    s.gauges();
                    (ticket, rx)
                }
            }
        };
        let mut waiting = Waiting {
            shared: self.shared.clone(),
            user: user.to_string(),
            ticket,
            seated: false,
        };
        match tokio::time::timeout(self.max_wait, rx).await {
            Ok(Ok(())) => {
                waiting.seated = true;
                Ok(Seat {
                    shared: self.shared.clone(),
                })
            }
            // Timed out (dropping `waiting` takes the request out of its queue).
            _ => {
                metrics::counter!(REJECTED, "reason" => "timeout").increment(1);
                Err(too_many_requests(format!(
                    "requests from user {} waited too long for this kcache replica's cache; please try again later",
                    go_quote(user)
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A flood from one user never delays another user's request by more than one seat's
    /// turn, and each user's queue is bounded.
    #[test]
    fn freed_seats_go_to_users_in_turn() {
        let mut q = Queues::new(2, 3, 0);
        let flood = "flood".to_string();
        let calm = "calm".to_string();
        // The flood takes both seats and fills its queue; its fourth waiter is refused.
        let arrivals: Vec<Effect> = (0..6).map(|t| q.arrive(&flood, t)).collect();
        assert_eq!(
            arrivals,
            [
                Effect::Seat(0),
                Effect::Seat(1),
                Effect::Wait(2),
                Effect::Wait(3),
                Effect::Wait(4),
                Effect::Refuse(5),
            ]
        );
        // Another user is not refused for the flood's queue, and gets the second seat freed.
        assert_eq!(q.arrive(&calm, 100), Effect::Wait(100));
        assert_eq!(q.finish(), Some(2));
        assert_eq!(q.finish(), Some(100));
        assert_eq!(q.finish(), Some(3));
        assert_eq!(q.finish(), Some(4));
        assert_eq!((q.busy(), q.waiting()), (2, 0));
        assert_eq!(q.finish(), None);
        assert_eq!(q.finish(), None);
        assert_eq!(q.busy(), 0);
        // Free seats again: served at once.
        assert_eq!(q.arrive(&calm, 101), Effect::Seat(101));
    }

    #[test]
    fn waiters_that_give_up_leave_their_queue() {
        let mut q = Queues::new(1, 2, 0);
        let (a, b) = ("a".to_string(), "b".to_string());
        assert_eq!(q.arrive(&a, 0), Effect::Seat(0));
        assert_eq!(q.arrive(&a, 1), Effect::Wait(1));
        assert_eq!(q.arrive(&b, 2), Effect::Wait(2));
        assert!(q.abandon(&a, 1));
        // Not waiting any more (or never was): its caller frees the seat it may hold.
        assert!(!q.abandon(&a, 1));
        assert!(!q.abandon(&b, 9));
        assert_eq!(q.finish(), Some(2));
        assert_eq!(q.waiting(), 0);
        // A user's queue has room again once its waiters are served or gone.
        assert_eq!(q.arrive(&a, 3), Effect::Wait(3));
        assert_eq!(q.arrive(&a, 4), Effect::Wait(4));
        assert_eq!(q.arrive(&a, 5), Effect::Refuse(5));
    }

    #[test]
    fn all_queues_together_are_bounded() {
        let mut q = Queues::new(1, 10, 3);
        assert_eq!(q.arrive(&"a", 0), Effect::Seat(0));
        assert_eq!(q.arrive(&"a", 1), Effect::Wait(1));
        assert_eq!(q.arrive(&"b", 2), Effect::Wait(2));
        assert_eq!(q.arrive(&"c", 3), Effect::Wait(3));
        // A fourth user finds every queue together full, though their own is empty.
        assert_eq!(q.arrive(&"d", 4), Effect::RefuseAll(4));
        assert_eq!(q.waiting(), 3);
        // A seat handed on, and a waiter giving up, make room again.
        assert_eq!(q.finish(), Some(1));
        assert!(q.abandon(&"c", 3));
        assert_eq!(q.waiting(), 1);
        assert_eq!(q.arrive(&"d", 5), Effect::Wait(5));
    }

    #[test]
    fn a_zero_queue_refuses_once_the_seats_are_taken() {
        let mut q = Queues::new(0, 0, 0);
        assert_eq!(q.arrive(&"a", 0), Effect::Seat(0));
        assert_eq!(q.arrive(&"a", 1), Effect::Refuse(1));
        assert_eq!(q.finish(), None);
        assert_eq!(q.arrive(&"a", 2), Effect::Seat(2));
    }

    #[actix_rt::test]
    async fn seats_are_handed_on_and_freed_by_leaving_waiters() {
        let f = Fairness::new(1, 10, 0, Duration::from_secs(5));
        let first = f.seat("a").await.expect("seat");
        // Waits for the first seat; a waiter that gives up leaves the queue.
        let gave_up = tokio::time::timeout(Duration::from_millis(20), f.seat("a")).await;
        assert!(gave_up.is_err(), "no seat while the only one is taken");
        let f2 = f.clone();
        let second = actix_rt::spawn(async move { f2.seat("b").await.map(|_| ()) });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(first);
        second.await.expect("join").expect("seat handed on");
        // Both seats are free again: the next one is at once.
        let s = f.shared.lock().expect("lock");
        assert_eq!(
            (s.queues.busy(), s.queues.waiting(), s.wake.len()),
            (0, 0, 0)
        );
    }

    #[actix_rt::test]
    async fn a_wait_too_long_is_a_429() {
        let f = Fairness::new(1, 10, 0, Duration::from_millis(30));
        let _held = f.seat("a").await.expect("seat");
        let e = f.seat("b").await.err().expect("timed out");
        assert_eq!((e.code, e.retry_after), (429, Some(1)));
        let s = f.shared.lock().expect("lock");
        assert_eq!(s.queues.waiting(), 0);
    }
}
