// Package kcachenats follows a kcache key over NATS in Go, the language of Kubernetes
// controllers: the subject contract of kcache's docs/nats.md (message headers, chunks,
// seals, signatures) and a subscriber's decisions (order by seq, fence by epoch, resync
// from a snapshot on a gap), as the Rust library clients/rust does. The decisions are
// pure ([Session]); both implementations replay the same recorded cases
// (clients/contract/messages.json) and must take the same decisions.
package kcachenats
