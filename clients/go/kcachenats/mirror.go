package kcachenats

// Stamp is what an owner stamps on each message.
type Stamp struct{ Epoch, Seq, RV uint64 }

// Resync says why a snapshot is needed.
type Resync string

const (
	ResyncStart    Resync = "start"
	ResyncGap      Resync = "gap"
	ResyncNewEpoch Resync = "new-epoch"
	ResyncRetry    Resync = "retry"
)

type held struct {
	s    Stamp
	body []byte
}

// Output is one decision of the mirror: exactly one field is set.
type Output struct {
	Apply    *Stamp // apply this event (body in Body)
	Snapshot *Stamp // replace the state (body in Body)
	Body     []byte
	Progress *uint64
	Resync   Resync
}

// Mirror orders one owner's stream: fencing by epoch, order and gaps by seq, resync by
// snapshot (kcache's core::mirror, the same rules).
type Mirror struct {
	epoch        uint64
	seq          *uint64
	heardMs      uint64
	StaleAfterMs uint64
	MaxBuffer    int
	buffer       []held
}

func NewMirror(staleAfterMs uint64, maxBuffer int) *Mirror {
	if maxBuffer < 1 {
		maxBuffer = 1
	}
	return &Mirror{StaleAfterMs: staleAfterMs, MaxBuffer: maxBuffer}
}

func (m *Mirror) Synced() bool { return m.seq != nil }

// Seq is the last seq applied (ok false while waiting for a snapshot).
func (m *Mirror) Seq() (uint64, bool) {
	if m.seq == nil {
		return 0, false
	}
	return *m.seq, true
}

func (m *Mirror) Epoch() uint64 { return m.epoch }

// Restart forgets the position; the epoch floor stays.
func (m *Mirror) Restart() { m.seq, m.buffer = nil, nil }

// Resume continues from a kept position without a snapshot; a position below the epoch
// already accepted is ignored.
func (m *Mirror) Resume(nowMs, epoch, seq uint64) {
	if epoch < m.epoch {
		return
	}
	m.epoch, m.heardMs, m.buffer = epoch, nowMs, nil
	s := seq
	m.seq = &s
}

func u64(v uint64) *uint64 { return &v }

func stampPtr(s Stamp) *Stamp { return &s }

// Kind of input.
const (
	inEvent = iota
	inHeartbeat
	inSnapshot
)

// On feeds one message of kind event, heartbeat or snapshot.
func (m *Mirror) On(nowMs uint64, in int, s Stamp, body []byte) []Output {
	var out []Output
	if s.Epoch < m.epoch {
		silent := nowMs-min(nowMs, m.heardMs) > m.StaleAfterMs
		if !silent {
			if in == inSnapshot {
				out = append(out, Output{Resync: ResyncRetry})
			}
			return out
		}
		m.epoch, m.seq, m.buffer = s.Epoch, nil, nil
		if in != inSnapshot {
			out = append(out, Output{Resync: ResyncNewEpoch})
		}
	} else if s.Epoch > m.epoch {
		m.epoch = s.Epoch
		wasSynced := m.seq != nil
		m.seq, m.buffer = nil, nil
		if wasSynced && in != inSnapshot {
			out = append(out, Output{Resync: ResyncNewEpoch})
		}
	}
	m.heardMs = nowMs
	switch in {
	case inSnapshot:
		m.seq = u64(s.Seq)
		out = append(out, Output{Snapshot: stampPtr(s), Body: body})
		out = m.drain(out)
	case inEvent:
		switch {
		case m.seq == nil:
			m.hold(s, body)
		case s.Seq <= *m.seq:
		case s.Seq == *m.seq+1:
			m.seq = u64(s.Seq)
			out = append(out, Output{Apply: stampPtr(s), Body: body})
		default:
			m.seq = nil
			m.hold(s, body)
			out = append(out, Output{Resync: ResyncGap})
		}
	case inHeartbeat:
		switch {
		case m.seq == nil:
		case s.Seq == *m.seq:
			out = append(out, Output{Progress: u64(s.RV)})
		case s.Seq > *m.seq:
			m.seq = nil
			out = append(out, Output{Resync: ResyncGap})
		}
	}
	return out
}

func (m *Mirror) hold(s Stamp, body []byte) {
	if len(m.buffer) == m.MaxBuffer {
		m.buffer = m.buffer[1:]
	}
	m.buffer = append(m.buffer, held{s, body})
}

func (m *Mirror) drain(out []Output) []Output {
	for len(m.buffer) > 0 {
		h := m.buffer[0]
		m.buffer = m.buffer[1:]
		if m.seq == nil {
			break
		}
		if h.s.Epoch != m.epoch || h.s.Seq <= *m.seq {
			continue
		}
		if h.s.Seq == *m.seq+1 {
			m.seq = u64(h.s.Seq)
			out = append(out, Output{Apply: stampPtr(h.s), Body: h.body})
		} else {
			m.seq, m.buffer = nil, nil
			out = append(out, Output{Resync: ResyncGap})
			break
		}
	}
	return out
}
