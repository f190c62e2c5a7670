package kcachenats

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Via says where a message came from.
type Via int

const (
	ViaLive  Via = iota // the key's events subject
	ViaLog              // an answer to a resume request: the key's retained events
	ViaReply            // an answer to a snapshot request
)

// Update is what a subscriber learns; exactly one of its fields is set.
type Update struct {
	Snapshot *Stamp // the key's whole state (a JSON List in Body): replace what you have
	Event    *Stamp // the next watch event line (in Body)
	Replayed bool   // the Event came from the retained log
	Body     []byte
	Progress *uint64 // complete up to this resourceVersion
	Resync   Resync  // a snapshot is needed (why)
	Refused  error   // a message was refused (a resync follows)
}

// Session is one key's subscriber state without NATS: messages in, updates out.
type Session struct {
	opener           Opener
	mirror           *Mirror
	live, log, reply Reassembler
	request          uint64
}

// NewSession: staleAfterMs, how long a silent owner of the highest epoch keeps lower
// epochs fenced off; buffer, events held while a snapshot is on the way.
func NewSession(o Opener, staleAfterMs uint64, buffer int) *Session {
	return &Session{opener: o, mirror: NewMirror(staleAfterMs, buffer)}
}

// Resume continues from a kept position (epoch, seq) without a snapshot.
func (s *Session) Resume(nowMs, epoch, seq uint64) { s.mirror.Resume(nowMs, epoch, seq) }

func (s *Session) Synced() bool { return s.mirror.Synced() }
func (s *Session) Position() (uint64, uint64, bool) {
	seq, ok := s.mirror.Seq()
	return s.mirror.Epoch(), seq, ok
}

// AnswerArriving says whether a snapshot answer is being collected: asking again now
// would throw it away.
func (s *Session) AnswerArriving() bool { return s.reply.Collecting() }

// Restart gives up the position: the next snapshot decides.
func (s *Session) Restart() { s.mirror.Restart() }

// Ask notes a new snapshot request; its number ends the request's reply subject.
func (s *Session) Ask() uint64 {
	s.reply.Reset()
	s.log.Reset()
	s.request++
	return s.request
}

// Step is what one message led to.
type Step struct {
	Updates []Update
	// Resync: a snapshot is needed (ask for one).
	Resync bool
	// End: a resume answer ended; EndErr says why it could not be given, else EndCount
	// messages were sent.
	End      bool
	EndCount uint64
	EndErr   error
}

// On feeds one message: its subject, a header lookup (nil: no headers, or a NATS
// status such as "no responders") and payload. Such a message is nothing — for a resume,
// the end of it.
func (s *Session) On(nowMs uint64, subject string, get func(string) (string, bool), payload []byte, via Via) Step {
	var step Step
	if get == nil {
		if via == ViaLog {
			step.End, step.EndErr = true, errors.New("no replica answers resume requests")
		}
		return step
	}
	if via != ViaLive {
		i := strings.LastIndexByte(subject, '.')
		n, err := strconv.ParseUint(subject[i+1:], 10, 64)
		if err != nil || n != s.request {
			return step
		}
	}
	if via == ViaLog {
		if v, ok := get(HResumeEnd); ok {
			n, err := strconv.ParseUint(v, 10, 64)
			step.End, step.EndCount = true, n
			if err != nil {
				step.EndErr = fmt.Errorf("a malformed %s: %q", HResumeEnd, v)
			}
			return step
		}
		if v, ok := get(HResumeError); ok {
			step.End, step.EndErr = true, errors.New(v)
			return step
		}
	}
	parts := &s.live
	switch via {
	case ViaLog:
		parts = &s.log
	case ViaReply:
		parts = &s.reply
	}
	refuse := func(err error) Step {
		s.mirror.Restart()
		return Step{Updates: []Update{{Refused: err}, {Resync: ResyncGap}}, Resync: true}
	}
	f, err := ParseFrame(get)
	if err != nil {
		return refuse(err)
	}
	// An event already applied (a live copy of a resumed one, a repeat): dropped before
	// its chunks are collected or its signature and seal checked — with a partial run of
	// it, collected before a snapshot covered it.
	if via != ViaReply && f.Kind == KindEvent && s.has(f.Epoch, f.Seq) {
		if f.ChunkN != 0 {
			parts.Reset()
		}
		return step
	}
	whole, done, err := parts.Feed(f, payload)
	if err != nil {
		return refuse(err)
	}
	if !done {
		return step
	}
	body, err := s.opener.Body(f, whole)
	if err != nil {
		return refuse(err)
	}
	st := Stamp{f.Epoch, f.Seq, f.RV}
	var in int
	switch {
	case f.Kind == KindHeartbeat && via == ViaLive:
		in = inHeartbeat
	case f.Kind == KindEvent && (via == ViaLive || via == ViaLog):
		in = inEvent
	case f.Kind == KindSnapshot && via == ViaReply:
		in = inSnapshot
	case f.Kind == KindNotReady && via == ViaReply:
		return step
	default:
		step.Updates = []Update{{Refused: fmt.Errorf("a %s message where none belongs", f.Kind)}}
		return step
	}
	for _, o := range s.mirror.On(nowMs, in, st, body) {
		switch {
		case o.Snapshot != nil:
			step.Updates = append(step.Updates, Update{Snapshot: o.Snapshot, Body: o.Body})
		case o.Apply != nil:
			step.Updates = append(step.Updates, Update{Event: o.Apply, Body: o.Body, Replayed: via == ViaLog})
		case o.Progress != nil:
			step.Updates = append(step.Updates, Update{Progress: o.Progress})
		case o.Resync != "":
			step.Resync = true
			step.Updates = append(step.Updates, Update{Resync: o.Resync})
		}
	}
	return step
}

// has says whether the event (epoch, seq) is one already applied.
func (s *Session) has(epoch, seq uint64) bool {
	last, ok := s.mirror.Seq()
	return ok && s.mirror.Epoch() == epoch && seq <= last
}
