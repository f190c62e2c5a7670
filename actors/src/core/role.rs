//! A key's role in the fleet as a pure state machine: owner, mirror or local, and when to
//! claim, renew, take over, hand over or fall back (`docs/nats.md`).
//!
//! As `core::upstream` does for one upstream read: `apply(now, input) -> effects`, no I/O.
//! The fleet's key task (`fleet::key_task`) feeds it what happened — a claim's or a
//! renewal's answer, a message heard from the owner, a tick carrying what the replica
//! knows (NATS connected, the owner's connection gone, its own upstream cut off, a healthy
//! peer) — and performs the effects it returns.
//!
//! The rules, each a row of the table tests below:
//! - a key starts by trying to create its lease; whoever creates it owns it, the others
//!   mirror;
//! - an owner renews every third of the TTL; a renewal refused because the lease moved
//!   (another replica took it while this one was paused) makes it a mirror at once;
//! - an owner whose own upstream has been failing for `cutoff_ms` while another replica
//!   can reach the API server releases the lease and mirrors, and claims nothing until
//!   its upstream works again (with no healthy peer it keeps the key: nobody could do
//!   better, and it resumes first when the API server is back);
//! - a mirror whose owner's NATS connection is gone (a crash: NATS answers "no
//!   responders" for the owner's presence) takes the lease over at once, compare-and-set
//!   against the dead owner's revision, without waiting for the lease to expire;
//! - a mirror that has heard nothing from its owner for three heartbeats tries to create
//!   the lease every third of the TTL, jittered, until the silent owner's lease expires
//!   (a paused owner is never taken over before its lease ends);
//! - a mirror cut off from NATS for `fallback_after_ms` watches upstream itself (local),
//!   and contends again, jittered, once NATS is back.

/// The timings a key's role runs on (`[nats]` configuration).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    pub lease_ttl_ms: u64,
    pub heartbeat_ms: u64,
    pub fallback_after_ms: u64,
    /// How long an owner's upstream may fail before it hands its keys to a healthy peer.
    pub cutoff_ms: u64,
}

impl Timing {
    fn renew_every(&self) -> u64 {
        (self.lease_ttl_ms / 3).max(1)
    }

    /// Silence after which a mirror suspects its owner.
    fn silence(&self) -> u64 {
        3 * self.heartbeat_ms
    }
}

/// Where the key is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Asking for the lease (start, or after an upstream end or NATS coming back).
    Contending,
    /// Holding the lease created at `epoch`, last written at `rev`.
    Owner { epoch: u64, rev: u64 },
    /// Following the owner.
    Mirror,
    /// Cut off from NATS: watching upstream itself.
    Local,
}

/// The answer to [`Effect::Claim`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claimed {
    /// This replica holds the lease now, created (or taken over) at this revision.
    Won { epoch: u64 },
    /// Someone else holds it.
    Lost,
    /// NATS or JetStream did not answer.
    Failed,
}

/// The answer to [`Effect::Renew`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewed {
    Ok {
        rev: u64,
    },
    /// The lease moved: another replica owns the key.
    Lost,
    /// The lease aged out and nobody holds it (renewals failed for a TTL, e.g. while the
    /// lease stream elected a new leader): create it again rather than give the key up.
    Expired,
    Failed,
}

/// What the replica knows at a tick.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct World {
    pub nats_connected: bool,
    /// The followed owner's NATS connection is gone (it crashed or was cut off).
    pub owner_gone: bool,
    /// This replica's own upstream has been failing for at least `cutoff_ms`.
    pub upstream_cut_off: bool,
    /// Another replica reports a working upstream.
    pub healthy_peer: bool,
    /// In [0, 1): spreads a fleet's claims over time.
    pub jitter: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    Start,
    Claimed(Claimed),
    Renewed(Renewed),
    /// A mirror accepted a message of the owner (not a fenced-off one).
    Heard,
    Tick(World),
    /// The upstream read this replica ran as owner or local stopped by itself.
    UpstreamEnded,
    /// The key stops on this replica.
    Stop,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// Create the lease; with `takeover`, overwrite a gone owner's lease instead
    /// (compare-and-set against its current revision, and only if it is still that
    /// owner's).
    Claim {
        takeover: bool,
    },
    Renew {
        rev: u64,
    },
    /// Delete this replica's lease message at `rev`, so another can claim at once.
    Release {
        rev: u64,
    },
    /// Start the upstream read and publishing as owner of `epoch`.
    Own {
        epoch: u64,
    },
    /// Still the owner, under a new epoch (its lease was created again): publish with it,
    /// keep the upstream read.
    Reown {
        epoch: u64,
    },
    /// Stop any upstream read; follow the owner (subscribe, resynchronise).
    Follow,
    /// Stop following; read upstream directly.
    GoLocal,
    /// The task ends.
    Exit,
}

/// Why a transition happened, for logs and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    LeaseLost,
    HandedOver,
    OwnerGone,
    OwnerSilent,
    NatsLost,
    NatsBack,
}

#[derive(Debug)]
pub struct RoleMachine {
    t: Timing,
    phase: Phase,
    /// Mirror: when the owner was last heard from.
    last_heard_ms: u64,
    /// Mirror: the earliest next claim.
    next_claim_ms: u64,
    /// Mirror: the earliest next takeover of a gone owner.
    next_takeover_ms: u64,
    /// Owner: the next renewal.
    next_renew_ms: u64,
    /// Owner: its lease aged out; the next attempt creates it again.
    expired: bool,
    /// A claim or renewal is in flight: nothing new is asked until it answers.
    asking: bool,
    /// Mirror: NATS has been disconnected since.
    cut_off_since: Option<u64>,
    /// Local: when to contend again (NATS is back).
    rejoin_at: Option<u64>,
    /// The last transition's reason.
    why: Option<Why>,
}

impl RoleMachine {
    pub fn new(t: Timing) -> Self {
        RoleMachine {
            t,
            phase: Phase::Contending,
            last_heard_ms: 0,
            next_claim_ms: 0,
            next_takeover_ms: 0,
            next_renew_ms: 0,
            expired: false,
            asking: false,
            cut_off_since: None,
            rejoin_at: None,
            why: None,
        }
    }

    pub fn phase(&self) -> &Phase {
        &self.phase
    }

    /// Why the last change of phase happened.
    pub fn why(&self) -> Option<Why> {
        self.why
    }

    /// How soon a failed renewal is tried again.
    fn retry_after(&self) -> u64 {
        (self.t.renew_every() / 4).max(100)
    }

    fn claim(&mut self, takeover: bool) -> Vec<Effect> {
        self.asking = true;
        vec![Effect::Claim { takeover }]
    }

    fn follow(&mut self, now: u64, why: Option<Why>) -> Vec<Effect> {
        self.phase = Phase::Mirror;
        self.why = why;
        self.asking = false;
        self.last_heard_ms = now;
        self.next_claim_ms = now + self.t.silence();
        self.cut_off_since = None;
        vec![Effect::Follow]
    }

    pub fn apply(&mut self, now: u64, input: Input) -> Vec<Effect> {
        use Phase as P;
        match (self.phase.clone(), input) {
            (_, Input::Stop) => match self.phase {
                P::Owner { rev, .. } => vec![Effect::Release { rev }, Effect::Exit],
                _ => vec![Effect::Exit],
            },
            (P::Contending, Input::Start) => self.claim(false),
            (_, Input::Start) => Vec::new(),

            (P::Contending | P::Mirror, Input::Claimed(Claimed::Won { epoch })) => {
                self.phase = P::Owner { epoch, rev: epoch };
                self.asking = false;
                self.next_renew_ms = now + self.t.renew_every();
                vec![Effect::Own { epoch }]
            }
            (P::Owner { .. }, Input::Claimed(Claimed::Won { epoch })) if self.expired => {
                self.expired = false;
                self.asking = false;
                self.phase = P::Owner { epoch, rev: epoch };
                self.next_renew_ms = now + self.t.renew_every();
                vec![Effect::Reown { epoch }]
            }
            (P::Owner { .. }, Input::Claimed(Claimed::Lost)) if self.expired => {
                self.expired = false;
                self.follow(now, Some(Why::LeaseLost))
            }
            (P::Owner { .. }, Input::Claimed(Claimed::Failed)) if self.expired => {
                self.asking = false;
                self.next_renew_ms = now + self.retry_after();
                Vec::new()
            }
            (P::Contending, Input::Claimed(_)) => self.follow(now, None),
            (P::Mirror, Input::Claimed(_)) => {
                self.asking = false;
                let third = self.t.renew_every();
                self.next_claim_ms = now + third;
                Vec::new()
            }
            (_, Input::Claimed(_)) => Vec::new(),

            (P::Owner { epoch, .. }, Input::Renewed(Renewed::Ok { rev })) => {
                self.asking = false;
                self.phase = P::Owner { epoch, rev };
                Vec::new()
            }
            (P::Owner { .. }, Input::Renewed(Renewed::Lost)) => {
                self.follow(now, Some(Why::LeaseLost))
            }
            (P::Owner { .. }, Input::Renewed(Renewed::Expired)) => {
                // Nobody took it: this replica's own lease ran out (JetStream was away
                // longer than the TTL). Create it again; giving the key up would leave it
                // without an owner until a mirror's silence timer.
                self.expired = true;
                self.claim(false)
            }
            (P::Owner { .. }, Input::Renewed(Renewed::Failed)) => {
                // NATS or JetStream is unreachable: keep the upstream watch and keep
                // serving; try again soon, so the lease does not age out meanwhile.
                self.asking = false;
                self.next_renew_ms = now + self.retry_after();
                Vec::new()
            }
            (_, Input::Renewed(_)) => Vec::new(),

            (P::Mirror, Input::Heard) => {
                self.last_heard_ms = now;
                Vec::new()
            }
            (_, Input::Heard) => Vec::new(),

            (P::Owner { rev, .. }, Input::UpstreamEnded) => {
                self.phase = P::Contending;
                let mut out = vec![Effect::Release { rev }];
                out.extend(self.claim(false));
                out
            }
            (P::Local, Input::UpstreamEnded) => {
                self.phase = P::Contending;
                self.claim(false)
            }
            (_, Input::UpstreamEnded) => Vec::new(),

            (P::Owner { rev, .. }, Input::Tick(w)) => {
                if w.upstream_cut_off && w.healthy_peer {
                    let mut out = vec![Effect::Release { rev }];
                    out.extend(self.follow(now, Some(Why::HandedOver)));
                    return out;
                }
                if !self.asking && now >= self.next_renew_ms {
                    self.next_renew_ms = now + self.t.renew_every();
                    if self.expired {
                        return self.claim(false);
                    }
                    self.asking = true;
                    return vec![Effect::Renew { rev }];
                }
                Vec::new()
            }
            (P::Mirror, Input::Tick(w)) => self.mirror_tick(now, &w),
            (P::Local, Input::Tick(w)) => {
                if !w.nats_connected {
                    self.rejoin_at = None;
                    return Vec::new();
                }
                let at = *self
                    .rejoin_at
                    .get_or_insert(now + (500.0 * w.jitter.clamp(0.0, 1.0)) as u64);
                if now < at {
                    return Vec::new();
                }
                self.rejoin_at = None;
                self.phase = P::Contending;
                self.why = Some(Why::NatsBack);
                self.claim(false)
            }
            (P::Contending, Input::Tick(_)) => Vec::new(),
        }
    }

    fn mirror_tick(&mut self, now: u64, w: &World) -> Vec<Effect> {
        if !w.nats_connected {
            let since = *self.cut_off_since.get_or_insert(now);
            if now.saturating_sub(since) >= self.t.fallback_after_ms {
                self.phase = Phase::Local;
                self.why = Some(Why::NatsLost);
                self.rejoin_at = None;
                return vec![Effect::GoLocal];
            }
            return Vec::new();
        }
        self.cut_off_since = None;
        // A replica that cannot reach the API server leaves the key to one that can.
        let may_own = !(w.upstream_cut_off && w.healthy_peer);
        if self.asking || !may_own {
            return Vec::new();
        }
        if w.owner_gone && now >= self.next_takeover_ms {
            // The owner's connection is gone: no need to wait for its lease to end. A
            // failed takeover waits a third of the TTL before the next.
            self.why = Some(Why::OwnerGone);
            self.next_takeover_ms = now + self.t.renew_every();
            return self.claim(true);
        }
        let silent = now.saturating_sub(self.last_heard_ms) > self.t.silence();
        if silent && now >= self.next_claim_ms {
            self.why = Some(Why::OwnerSilent);
            let third = self.t.renew_every();
            self.next_claim_ms = now + third + (third as f64 * w.jitter.clamp(0.0, 1.0)) as u64;
            return self.claim(false);
        }
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timing = Timing {
        lease_ttl_ms: 3_000,
        heartbeat_ms: 100,
        fallback_after_ms: 1_000,
        cutoff_ms: 5_000,
    };

    fn world() -> World {
        World {
            nats_connected: true,
            ..World::default()
        }
    }

    fn started() -> RoleMachine {
        let mut m = RoleMachine::new(T);
        assert_eq!(
            m.apply(0, Input::Start),
            [Effect::Claim { takeover: false }]
        );
        m
    }

    fn owner() -> RoleMachine {
        let mut m = started();
        assert_eq!(
            m.apply(1, Input::Claimed(Claimed::Won { epoch: 7 })),
            [Effect::Own { epoch: 7 }]
        );
        m
    }

    fn mirror() -> RoleMachine {
        let mut m = started();
        assert_eq!(m.apply(1, Input::Claimed(Claimed::Lost)), [Effect::Follow]);
        m
    }

    #[test]
    fn a_failed_first_claim_follows_too() {
        let mut m = started();
        assert_eq!(
            m.apply(1, Input::Claimed(Claimed::Failed)),
            [Effect::Follow]
        );
        assert_eq!(m.phase(), &Phase::Mirror);
    }

    #[test]
    fn owner_renews_every_third_of_the_ttl_one_at_a_time() {
        let mut m = owner();
        assert_eq!(m.apply(500, Input::Tick(world())), []);
        assert_eq!(
            m.apply(1_001, Input::Tick(world())),
            [Effect::Renew { rev: 7 }]
        );
        // Still in flight: nothing new.
        assert_eq!(m.apply(2_500, Input::Tick(world())), []);
        assert_eq!(m.apply(2_600, Input::Renewed(Renewed::Ok { rev: 9 })), []);
        assert_eq!(
            m.apply(2_601, Input::Tick(world())),
            [Effect::Renew { rev: 9 }]
        );
        assert_eq!(m.phase(), &Phase::Owner { epoch: 7, rev: 9 });
    }

    #[test]
    fn owner_whose_renewal_is_refused_steps_down_at_once() {
        let mut m = owner();
        m.apply(1_001, Input::Tick(world()));
        assert_eq!(
            m.apply(1_002, Input::Renewed(Renewed::Lost)),
            [Effect::Follow]
        );
        assert_eq!(m.why(), Some(Why::LeaseLost));
    }

    #[test]
    fn owner_keeps_the_key_while_nats_is_unreachable() {
        let mut m = owner();
        m.apply(1_001, Input::Tick(world()));
        assert_eq!(m.apply(1_100, Input::Renewed(Renewed::Failed)), []);
        assert_eq!(m.phase(), &Phase::Owner { epoch: 7, rev: 7 });
        let cut = World {
            nats_connected: false,
            ..world()
        };
        // Tried again a quarter of a renewal period later, not a whole one.
        assert_eq!(m.apply(1_300, Input::Tick(cut.clone())), []);
        assert_eq!(m.apply(1_350, Input::Tick(cut)), [Effect::Renew { rev: 7 }]);
    }

    #[test]
    fn owner_whose_lease_aged_out_creates_it_again_under_a_new_epoch() {
        let mut m = owner();
        m.apply(1_001, Input::Tick(world()));
        assert_eq!(
            m.apply(1_002, Input::Renewed(Renewed::Expired)),
            [Effect::Claim { takeover: false }]
        );
        assert_eq!(
            m.apply(1_003, Input::Claimed(Claimed::Won { epoch: 12 })),
            [Effect::Reown { epoch: 12 }]
        );
        assert_eq!(m.phase(), &Phase::Owner { epoch: 12, rev: 12 });
        assert_eq!(
            m.apply(2_004, Input::Tick(world())),
            [Effect::Renew { rev: 12 }]
        );
    }

    #[test]
    fn owner_whose_lease_aged_out_and_was_taken_follows() {
        let mut m = owner();
        m.apply(1_001, Input::Tick(world()));
        m.apply(1_002, Input::Renewed(Renewed::Expired));
        // JetStream still away: the next try is a create again, soon.
        assert_eq!(m.apply(1_003, Input::Claimed(Claimed::Failed)), []);
        assert_eq!(
            m.apply(1_300, Input::Tick(world())),
            [Effect::Claim { takeover: false }]
        );
        assert_eq!(
            m.apply(1_301, Input::Claimed(Claimed::Lost)),
            [Effect::Follow]
        );
        assert_eq!(m.why(), Some(Why::LeaseLost));
    }

    #[test]
    fn owner_cut_off_hands_over_only_to_a_healthy_peer() {
        let mut m = owner();
        let alone = World {
            upstream_cut_off: true,
            healthy_peer: false,
            ..world()
        };
        assert_eq!(m.apply(100, Input::Tick(alone.clone())), []);
        let peer = World {
            healthy_peer: true,
            ..alone
        };
        assert_eq!(
            m.apply(200, Input::Tick(peer.clone())),
            [Effect::Release { rev: 7 }, Effect::Follow]
        );
        assert_eq!(m.why(), Some(Why::HandedOver));
        // Long silent, but it cannot reach the API server: it claims nothing.
        assert_eq!(m.apply(60_000, Input::Tick(peer)), []);
        // Its upstream works again: it may own again.
        assert_eq!(
            m.apply(60_100, Input::Tick(world())),
            [Effect::Claim { takeover: false }]
        );
    }

    #[test]
    fn mirror_waits_three_heartbeats_of_silence_then_claims_jittered() {
        let mut m = mirror();
        assert_eq!(m.apply(250, Input::Tick(world())), []);
        m.apply(250, Input::Heard);
        assert_eq!(m.apply(500, Input::Tick(world())), []);
        assert_eq!(
            m.apply(551, Input::Tick(world())),
            [Effect::Claim { takeover: false }]
        );
        assert_eq!(m.why(), Some(Why::OwnerSilent));
        assert_eq!(m.apply(552, Input::Claimed(Claimed::Lost)), []);
        // The next try comes a third of the TTL later, plus jitter.
        let w = World {
            jitter: 0.5,
            ..world()
        };
        assert_eq!(m.apply(1_551, Input::Tick(w.clone())), []);
        assert_eq!(
            m.apply(1_552, Input::Tick(w)),
            [Effect::Claim { takeover: false }]
        );
        assert_eq!(
            m.apply(1_600, Input::Claimed(Claimed::Won { epoch: 12 })),
            [Effect::Own { epoch: 12 }]
        );
    }

    #[test]
    fn mirror_takes_over_at_once_when_the_owner_is_gone() {
        let mut m = mirror();
        m.apply(50, Input::Heard);
        let gone = World {
            owner_gone: true,
            ..world()
        };
        assert_eq!(
            m.apply(60, Input::Tick(gone.clone())),
            [Effect::Claim { takeover: true }]
        );
        assert_eq!(m.why(), Some(Why::OwnerGone));
        // Lost the race to another mirror: wait before asking again.
        assert_eq!(m.apply(70, Input::Claimed(Claimed::Lost)), []);
        assert_eq!(m.apply(80, Input::Tick(gone.clone())), []);
        assert_eq!(
            m.apply(1_070, Input::Tick(gone)),
            [Effect::Claim { takeover: true }]
        );
    }

    #[test]
    fn a_gone_owner_is_not_taken_over_by_a_cut_off_mirror_while_a_peer_is_healthy() {
        let mut m = mirror();
        let w = World {
            owner_gone: true,
            upstream_cut_off: true,
            healthy_peer: true,
            ..world()
        };
        assert_eq!(m.apply(100, Input::Tick(w.clone())), []);
        // No one healthy: it takes the key (someone must hold it for the API server's
        // return).
        let alone = World {
            healthy_peer: false,
            ..w
        };
        assert_eq!(
            m.apply(200, Input::Tick(alone)),
            [Effect::Claim { takeover: true }]
        );
    }

    #[test]
    fn mirror_falls_back_to_local_and_rejoins_jittered() {
        let mut m = mirror();
        let cut = World {
            nats_connected: false,
            ..world()
        };
        assert_eq!(m.apply(100, Input::Tick(cut.clone())), []);
        // Back in between (and the owner heard): the count restarts.
        m.apply(590, Input::Heard);
        assert_eq!(m.apply(600, Input::Tick(world())), []);
        assert_eq!(m.apply(700, Input::Tick(cut.clone())), []);
        assert_eq!(m.apply(1_700, Input::Tick(cut.clone())), [Effect::GoLocal]);
        assert_eq!(m.why(), Some(Why::NatsLost));
        assert_eq!(m.apply(2_000, Input::Tick(cut)), []);
        let back = World {
            jitter: 0.5,
            ..world()
        };
        assert_eq!(m.apply(3_000, Input::Tick(back.clone())), []);
        assert_eq!(
            m.apply(3_250, Input::Tick(back)),
            [Effect::Claim { takeover: false }]
        );
        assert_eq!(m.phase(), &Phase::Contending);
        assert_eq!(m.why(), Some(Why::NatsBack));
    }

    #[test]
    fn an_ended_upstream_releases_and_contends_again() {
        let mut m = owner();
        assert_eq!(
            m.apply(10, Input::UpstreamEnded),
            [
                Effect::Release { rev: 7 },
                Effect::Claim { takeover: false }
            ]
        );
        assert_eq!(m.phase(), &Phase::Contending);
        assert_eq!(m.apply(11, Input::UpstreamEnded), []);
    }

    #[test]
    fn stop_releases_only_an_owned_lease() {
        let mut m = owner();
        assert_eq!(
            m.apply(10, Input::Stop),
            [Effect::Release { rev: 7 }, Effect::Exit]
        );
        let mut m = mirror();
        assert_eq!(m.apply(10, Input::Stop), [Effect::Exit]);
    }

    #[test]
    fn answers_out_of_phase_are_ignored() {
        let mut m = mirror();
        assert_eq!(m.apply(5, Input::Renewed(Renewed::Lost)), []);
        let mut m = owner();
        assert_eq!(m.apply(5, Input::Claimed(Claimed::Won { epoch: 99 })), []);
        assert_eq!(m.apply(6, Input::Heard), []);
        assert_eq!(m.phase(), &Phase::Owner { epoch: 7, rev: 7 });
    }
}
