package kcachenats

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"testing"
)

// The subject contract's shared cases (clients/contract/messages.json, made by the Rust
// recorder): each recorded message fed to a Session, the decisions compared with the
// ones the case states — the same file the Rust library's contract test replays.

type contractFile struct {
	Contract   int                        `json:"contract"`
	SealKeys   []struct{ ID, Key string } `json:"sealKeys"`
	VerifyKeys []string                   `json:"verifyKeys"`
	Cases      []struct {
		Name   string `json:"name"`
		Key    string `json:"key"`
		Sealed bool   `json:"sealed"`
		Resume *struct {
			Epoch uint64 `json:"epoch"`
			Seq   uint64 `json:"seq"`
		} `json:"resume"`
		Steps []struct {
			Ask     bool        `json:"ask"`
			Via     string      `json:"via"`
			Subject string      `json:"subject"`
			Headers [][2]string `json:"headers"`
			Payload string      `json:"payload"`
			Want    []string    `json:"want"`
		} `json:"steps"`
	} `json:"cases"`
}

func decision(u Update) string {
	switch {
	case u.Snapshot != nil:
		return fmt.Sprintf("snapshot %d:%d", u.Snapshot.Epoch, u.Snapshot.Seq)
	case u.Event != nil:
		s := fmt.Sprintf("apply %d:%d", u.Event.Epoch, u.Event.Seq)
		if u.Replayed {
			s += " replayed"
		}
		return s
	case u.Progress != nil:
		return fmt.Sprintf("progress %d", *u.Progress)
	case u.Resync != "":
		return "resync " + string(u.Resync)
	case u.Refused != nil:
		return "refused"
	}
	return "?"
}

func TestEveryRecordedCaseLeadsToItsDecisions(t *testing.T) {
	raw, err := os.ReadFile("../../contract/messages.json")
	if err != nil {
		t.Fatal(err)
	}
	var file contractFile
	if err := json.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	if file.Contract != ContractVersion {
		t.Fatalf("cases of contract %d, this package reads %d", file.Contract, ContractVersion)
	}
	if len(file.Cases) < 10 {
		t.Fatalf("only %d cases", len(file.Cases))
	}
	b64 := func(s string) []byte {
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	keys := map[string][]byte{}
	for _, k := range file.SealKeys {
		keys[k.ID] = b64(k.Key)
	}
	var verify []ed25519.PublicKey
	for _, k := range file.VerifyKeys {
		verify = append(verify, ed25519.PublicKey(b64(k)))
	}
	for _, c := range file.Cases {
		t.Run(c.Name, func(t *testing.T) {
			o := Opener{Token: c.Key, Verify: verify}
			if c.Sealed {
				o.Keys = keys
			}
			s := NewSession(o, 20_000, 100)
			if c.Resume != nil {
				s.Resume(0, c.Resume.Epoch, c.Resume.Seq)
			}
			for i, st := range c.Steps {
				if st.Ask {
					s.Ask()
					continue
				}
				via := map[string]Via{"live": ViaLive, "log": ViaLog, "reply": ViaReply}[st.Via]
				headers := map[string]string{}
				for _, h := range st.Headers {
					headers[h[0]] = h[1]
				}
				get := func(n string) (string, bool) { v, ok := headers[n]; return v, ok }
				out := s.On(uint64(1+i), st.Subject, get, b64(st.Payload), via)
				got := []string{}
				for _, u := range out.Updates {
					got = append(got, decision(u))
				}
				switch {
				case out.End && out.EndErr != nil:
					got = append(got, "end error")
				case out.End:
					got = append(got, fmt.Sprintf("end %d", out.EndCount))
				}
				want := st.Want
				if want == nil {
					want = []string{}
				}
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("step %d: got %v, want %v", i, got, want)
				}
			}
		})
	}
}
