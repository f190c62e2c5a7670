package kcachenats

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
)

// Header names of the subject contract.
const (
	HType      = "Kcache-Type"
	HEpoch     = "Kcache-Epoch"
	HSeq       = "Kcache-Seq"
	HRV        = "Kcache-Rv"
	HOwner     = "Kcache-Owner"
	HChunk     = "Kcache-Chunk"
	HKeyID     = "Kcache-Key-Id"
	HSignature = "Kcache-Signature"
	HContract  = "Kcache-Contract"
	// HResumeEnd ends a resume answer: how many retained messages were sent.
	HResumeEnd = "Kcache-Resume-End"
	// HResumeError ends a resume answer that could not be given (why).
	HResumeError = "Kcache-Resume-Error"
)

// ContractVersion is the highest contract version this package reads.
const ContractVersion = 1

// Kind is a message's type.
type Kind string

const (
	KindEvent     Kind = "event"
	KindHeartbeat Kind = "heartbeat"
	KindSnapshot  Kind = "snapshot"
	KindReplay    Kind = "replay"
	KindNotReady  Kind = "not-ready"
)

// Frame is what a message's headers say.
type Frame struct {
	Kind           Kind
	Epoch, Seq, RV uint64
	Owner          string
	ChunkI, ChunkN uint32 // 0, 0 when the body is whole
	KeyID          string
	// Sealed: a Kcache-Key-Id header is present (even an empty one, which names no key
	// and is refused).
	Sealed    bool
	Signature string // "" when not signed
}

// parseUint reads a decimal number as kcache does (Rust's str::parse): an optional
// leading '+', then digits.
func parseUint(s string, bits int) (uint64, error) {
	return strconv.ParseUint(strings.TrimPrefix(s, "+"), 10, bits)
}

// ParseFrame reads a frame through a header lookup, refusing a later contract version
// before anything else.
func ParseFrame(get func(string) (string, bool)) (Frame, error) {
	var f Frame
	if v, ok := get(HContract); ok {
		n, err := parseUint(strings.TrimSpace(v), 32)
		if err != nil {
			return f, fmt.Errorf("missing or malformed header %s", HContract)
		}
		if n > ContractVersion {
			return f, fmt.Errorf("a message of subject contract version %d; this reader knows up to %d", n, ContractVersion)
		}
	}
	t, ok := get(HType)
	if !ok {
		return f, fmt.Errorf("missing or malformed header %s", HType)
	}
	switch Kind(t) {
	case KindEvent, KindHeartbeat, KindSnapshot, KindReplay, KindNotReady:
		f.Kind = Kind(t)
	default:
		return f, fmt.Errorf("unknown message type %q", t)
	}
	num := func(name string) (uint64, error) {
		v, ok := get(name)
		if !ok {
			return 0, fmt.Errorf("missing or malformed header %s", name)
		}
		n, err := parseUint(strings.TrimSpace(v), 64)
		if err != nil {
			return 0, fmt.Errorf("missing or malformed header %s", name)
		}
		return n, nil
	}
	var err error
	if f.Epoch, err = num(HEpoch); err != nil {
		return f, err
	}
	if f.Seq, err = num(HSeq); err != nil {
		return f, err
	}
	if f.RV, err = num(HRV); err != nil {
		return f, err
	}
	if v, ok := get(HChunk); ok {
		i, n, found := strings.Cut(v, "/")
		ci, err1 := parseUint(i, 32)
		cn, err2 := parseUint(n, 32)
		// A body is only chunked when it needs two chunks or more.
		if !found || err1 != nil || err2 != nil || ci == 0 || ci > cn || cn < 2 {
			return f, fmt.Errorf("missing or malformed header %s", HChunk)
		}
		f.ChunkI, f.ChunkN = uint32(ci), uint32(cn)
	}
	f.Owner, _ = get(HOwner)
	f.KeyID, f.Sealed = get(HKeyID)
	f.Signature, _ = get(HSignature)
	return f, nil
}

// AssociatedData is what a seal and a signature bind: the key's token and every header a
// reader trusts, each length-prefixed (kcache's wire::Frame::associated_data).
func (f Frame) AssociatedData(token string) []byte {
	ad := []byte("kcache-seal-v2")
	field := func(b []byte) {
		ad = binary.BigEndian.AppendUint32(ad, uint32(len(b)))
		ad = append(ad, b...)
	}
	num := func(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }
	field([]byte(token))
	field([]byte(f.Kind))
	field(num(f.Epoch))
	field(num(f.Seq))
	field(num(f.RV))
	field([]byte(f.Owner))
	field([]byte(f.KeyID))
	return ad
}
