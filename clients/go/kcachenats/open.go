package kcachenats

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/crypto/chacha20poly1305"
)

// KeyID is a public key's id: its SHA-256's first 8 bytes, in hex.
func KeyID(pub ed25519.PublicKey) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:8])
}

// Opener checks and opens a key's messages as its owner made them: a signature of one of
// the fleet's public keys over the associated data and the body as sent (when Verify is
// set), then the seal (when Keys is set: then every message must be sealed).
type Opener struct {
	// Token is the key's six escaped tokens, bound into every seal and signature.
	Token string
	// Keys open sealed resources (Secrets): key id → 32 bytes. Set only for a sealed kind.
	Keys map[string][]byte
	// Verify: the fleet's public keys; set, only messages signed by one of them are taken.
	Verify []ed25519.PublicKey
}

// Body verifies and opens a whole body.
func (o *Opener) Body(f Frame, body []byte) ([]byte, error) {
	ad := f.AssociatedData(o.Token)
	if len(o.Verify) > 0 {
		if err := o.verify(f.Signature, ad, body); err != nil {
			return nil, err
		}
	}
	switch {
	case f.Sealed && o.Keys != nil:
		key, ok := o.Keys[f.KeyID]
		if !ok {
			return nil, fmt.Errorf("sealed with unknown key %q", f.KeyID)
		}
		aead, err := chacha20poly1305.New(key)
		if err != nil {
			return nil, err
		}
		if len(body) < aead.NonceSize()+aead.Overhead() {
			return nil, errors.New("sealed body truncated")
		}
		plain, err := aead.Open(nil, body[:aead.NonceSize()], body[aead.NonceSize():], ad)
		if err != nil {
			return nil, errors.New("sealed message does not authenticate (wrong key, or its headers or body were changed)")
		}
		return plain, nil
	case f.Sealed:
		return nil, fmt.Errorf("sealed with key %q but no keys were given", f.KeyID)
	case o.Keys != nil:
		return nil, errors.New("a sealed resource's message arrived unsealed; refused")
	default:
		return body, nil
	}
}

func (o *Opener) verify(header string, ad, body []byte) error {
	if header == "" {
		return errors.New("the message is not signed")
	}
	id, sig, ok := strings.Cut(header, ".")
	if !ok {
		return errors.New("signature header is not `<key id>.<base64>`")
	}
	raw, err := base64.RawStdEncoding.Strict().DecodeString(sig)
	if err != nil {
		return errors.New("signature header is not `<key id>.<base64>`")
	}
	for _, pub := range o.Verify {
		if len(pub) != ed25519.PublicKeySize {
			return fmt.Errorf("a verify key is %d bytes, not %d", len(pub), ed25519.PublicKeySize)
		}
		if KeyID(pub) == id {
			msg := append(append([]byte{}, ad...), body...)
			if ed25519.Verify(pub, msg, raw) {
				return nil
			}
			return errors.New("signature does not verify (forged, or the message was changed)")
		}
	}
	return fmt.Errorf("signed with key %q, which is not the fleet's", id)
}
