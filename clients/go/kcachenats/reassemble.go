package kcachenats

import "fmt"

// MaxEventBytes is the largest event reassembled (one object; kcache's wire::MAX_EVENT_BYTES).
const MaxEventBytes = 16 << 20

// DefaultMaxMessageBytes bounds a snapshot (a whole key).
const DefaultMaxMessageBytes int64 = 2 << 30

type run struct {
	kind           Kind
	epoch, seq, rv uint64
	owner, keyID   string
	total          uint32
}

func runOf(f Frame) run {
	return run{f.Kind, f.Epoch, f.Seq, f.RV, f.Owner, f.KeyID, f.ChunkN}
}

// Reassembler joins a run of chunks of one message (`1/n … n/n`, in order, every header
// but the chunk's alike) up to a size bound; a broken run is an error once (a gap), its
// remaining chunks dropped quietly.
type Reassembler struct {
	MaxBytes int64
	partial  *run
	next     uint32
	buf      []byte
	dropped  *run
}

func (r *Reassembler) limit(k Kind) int64 {
	max := r.MaxBytes
	if max == 0 {
		max = DefaultMaxMessageBytes
	}
	if k == KindEvent && max > MaxEventBytes {
		return MaxEventBytes
	}
	return max
}

// Collecting says whether a message is being collected (its first chunks came, not its
// last).
func (r *Reassembler) Collecting() bool { return r.partial != nil }

// Reset forgets a partial message.
func (r *Reassembler) Reset() { r.partial, r.dropped, r.buf = nil, nil, nil }

// Feed adds one message; the whole body once complete (done), nothing while collecting.
func (r *Reassembler) Feed(f Frame, body []byte) (whole []byte, done bool, err error) {
	limit := r.limit(f.Kind)
	if f.ChunkN == 0 {
		if r.partial != nil {
			expected := r.next
			r.dropped, r.partial, r.buf = r.partial, nil, nil
			return nil, false, fmt.Errorf("chunk 0/%d out of order (expected %d)", r.dropped.total, expected)
		}
		if int64(len(body)) > limit {
			return nil, false, fmt.Errorf("%s message of %d bytes is over the %d-byte limit", f.Kind, len(body), limit)
		}
		return body, true, nil
	}
	this := runOf(f)
	continues := r.partial != nil && *r.partial == this && r.next == f.ChunkI
	var broken error
	if !continues {
		if f.ChunkI > 1 && r.dropped != nil && *r.dropped == this {
			return nil, false, nil
		}
		switch {
		case r.partial != nil:
			broken = fmt.Errorf("chunk %d/%d out of order (expected %d)", f.ChunkI, f.ChunkN, r.next)
			r.dropped, r.partial, r.buf = r.partial, nil, nil
		case f.ChunkI > 1:
			broken = fmt.Errorf("chunk %d/%d out of order (expected 1)", f.ChunkI, f.ChunkN)
			r.dropped = &this
		}
		if f.ChunkI == 1 {
			atLeast := uint64(f.ChunkN-1)*uint64(len(body)) + 1
			if atLeast < uint64(f.ChunkN) {
				atLeast = uint64(f.ChunkN)
			}
			if atLeast > uint64(limit) {
				r.dropped = &this
				return nil, false, fmt.Errorf("%s message of at least %d bytes is over the %d-byte limit", f.Kind, atLeast, limit)
			}
			if r.dropped != nil && *r.dropped == this {
				r.dropped = nil
			}
			r.partial, r.next, r.buf = &this, 1, nil
		}
	}
	whole, done, err = r.append(f, body, limit)
	if broken != nil && err == nil {
		return nil, false, broken
	}
	return whole, done, err
}

func (r *Reassembler) append(f Frame, body []byte, limit int64) ([]byte, bool, error) {
	if r.partial == nil {
		return nil, false, nil
	}
	if int64(len(r.buf)+len(body)) > limit {
		size := len(r.buf) + len(body)
		r.dropped, r.partial, r.buf = r.partial, nil, nil
		return nil, false, fmt.Errorf("%s message of at least %d bytes is over the %d-byte limit", f.Kind, size, limit)
	}
	r.buf = append(r.buf, body...)
	if f.ChunkI == f.ChunkN {
		whole := r.buf
		if whole == nil {
			whole = []byte{}
		}
		r.partial, r.buf = nil, nil
		return whole, true, nil
	}
	r.next = f.ChunkI + 1
	return nil, false, nil
}
