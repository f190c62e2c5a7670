//! A client certificate's identity, read exactly as the reference API server reads it
//! (Go's `crypto/x509` parser, `pkix.Name.FillFromRDNSequence`, and the x509 authenticator's
//! `CommonNameUserConversion` in `k8s.io/apiserver`), because kcache authorizes — and
//! impersonates nodes — with what it reads here:
//!
//! - Every attribute value of the subject (and issuer) must be one of Go's six string types
//!   (T61String read as Latin-1, PrintableString with Go's extra `*` and `&`, UTF8String,
//!   BMPString as UCS-2, IA5String, NumericString), valid for its type; anything else makes
//!   Go refuse the whole certificate, so the TLS handshake fails ([`go_parses_names`]).
//! - The user is the **last** common name in the subject (multi-valued RDNs flattened in
//!   order); the groups are every organization, in order.
//! - An empty (or absent) common name gives **no** identity: the next authenticator
//!   (a bearer token, else anonymous) decides.
//! - The UID is the single `1.3.6.1.4.1.57683.2` attribute (`AllowParsingUserUIDFromCertAuth`,
//!   on by default since 1.33); several, or an empty one, fail authentication (a bearer
//!   token may still succeed; anonymous may not).
//! - `extra["authentication.kubernetes.io/credential-id"]` is `X509SHA256=<hex>` of the
//!   leaf's DER.

use std::collections::BTreeMap;

use thiserror::Error;
use x509_parser::der_parser::asn1_rs::{Class, Tag};
use x509_parser::x509::X509Name;

/// `user.CredentialIDKey`.
pub const CREDENTIAL_ID: &str = "authentication.kubernetes.io/credential-id";

/// `asn1util.X509UID()`: the Kubernetes user UID attribute of a distinguished name.
const UID_OID: &str = "1.3.6.1.4.1.57683.2";
const CN_OID: &str = "2.5.4.3";
const O_OID: &str = "2.5.4.10";

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Error {
    /// Go's parser refuses the certificate (the API server fails the handshake).
    #[error("x509: invalid certificate: {0}")]
    Unparsable(String),
    /// The x509 authenticator fails (the request is unauthenticated unless a bearer token
    /// authenticates it).
    #[error("x509 authentication failed: {0}")]
    Authentication(String),
}

/// What the x509 authenticator makes of a verified leaf certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// Authenticated.
    User {
        name: String,
        uid: String,
        groups: Vec<String>,
        extra: BTreeMap<String, Vec<String>>,
    },
    /// No common name: the certificate says nothing; other credentials decide.
    Nobody,
}

/// The identity of leaf certificate `der`.
pub fn identity(der: &[u8]) -> Result<Identity, Error> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|e| Error::Unparsable(e.to_string()))?;
    let attrs = go_strings(cert.subject())?;
    let value_of = |oid: &'static str| attrs.iter().filter(move |(t, _)| t == oid).map(|(_, v)| v);
    let name = value_of(CN_OID).next_back().cloned().unwrap_or_default();
    if name.is_empty() {
        return Ok(Identity::Nobody);
    }
    let groups = value_of(O_OID).cloned().collect();
    let uids: Vec<&String> = value_of(UID_OID).collect();
    let uid = match uids.as_slice() {
        [] => String::new(),
        [uid] if uid.is_empty() => {
            return Err(Error::Authentication(
                "UID cannot be an empty string".into(),
            ))
        }
        [uid] => (*uid).clone(),
        _ => {
            return Err(Error::Authentication(format!(
                "expected 1 UID, but found multiple: {uids:?}"
            )))
        }
    };
    let fingerprint = ring::digest::digest(&ring::digest::SHA256, der);
    let hex: String = fingerprint
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let extra = BTreeMap::from([(CREDENTIAL_ID.to_string(), vec![format!("X509SHA256={hex}")])]);
    Ok(Identity::User {
        name,
        uid,
        groups,
        extra,
    })
}

/// Whether Go's parser reads `der`'s subject and issuer: every attribute value one of its
/// string types, valid for that type.
pub fn go_parses_names(der: &[u8]) -> Result<(), Error> {
    let (_, cert) =
        x509_parser::parse_x509_certificate(der).map_err(|e| Error::Unparsable(e.to_string()))?;
    go_strings(cert.subject())?;
    go_strings(cert.issuer())?;
    Ok(())
}

/// The attributes of `name` in order (RDNs flattened) as (OID, string), or Go's refusal.
fn go_strings(name: &X509Name) -> Result<Vec<(String, String)>, Error> {
    let mut out = Vec::new();
    for rdn in name.iter() {
        for atv in rdn.iter() {
            let value = atv.attr_value();
            let header = &value.header;
            let tag = (header.class() == Class::Universal && !header.is_constructed())
                .then(|| header.tag());
            let s = go_string(tag, value.data).map_err(|e| {
                Error::Unparsable(format!("invalid RDNSequence: invalid attribute value: {e}"))
            })?;
            out.push((atv.attr_type().to_id_string(), s));
        }
    }
    Ok(out)
}

/// Go's `parseASN1String`: `tag` is the universal, primitive tag of the value (`None` for
/// any other class or a constructed value, which Go refuses as well).
fn go_string(tag: Option<Tag>, value: &[u8]) -> Result<String, String> {
    match tag {
        // Latin-1: every byte is the code point of the same value.
        Some(Tag::T61String) => Ok(value.iter().map(|&b| char::from(b)).collect()),
        Some(Tag::PrintableString) => value
            .iter()
            .all(|&b| is_printable(b))
            .then(|| String::from_utf8_lossy(value).into_owned())
            .ok_or_else(|| "invalid PrintableString".into()),
        Some(Tag::Utf8String) => std::str::from_utf8(value)
            .map(str::to_string)
            .map_err(|_| "invalid UTF-8 string".into()),
        Some(Tag::BmpString) => bmp_string(value).ok_or_else(|| "invalid BMPString".into()),
        Some(Tag::Ia5String) => value
            .iter()
            .all(u8::is_ascii)
            .then(|| String::from_utf8_lossy(value).into_owned())
            .ok_or_else(|| "invalid IA5String".into()),
        Some(Tag::NumericString) => value
            .iter()
            .all(|&b| b.is_ascii_digit() || b == b' ')
            .then(|| String::from_utf8_lossy(value).into_owned())
            .ok_or_else(|| "invalid NumericString".into()),
        Some(t) => Err(format!("unsupported string type: {}", t.0)),
        None => Err("unsupported string type".into()),
    }
}

/// Go's `isPrintable`: PrintableString's alphabet plus `*` and `&`, which certificates use.
fn is_printable(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || (b'\''..=b')').contains(&b)
        || (b'+'..=b'/').contains(&b)
        || matches!(b, b' ' | b':' | b'=' | b'?' | b'*' | b'&')
}

/// UCS-2 (big-endian), an optional terminating NUL stripped; surrogates and the
/// permanent noncharacters refused, as Go does.
fn bmp_string(value: &[u8]) -> Option<String> {
    if !value.len().is_multiple_of(2) {
        return None;
    }
    let value = value.strip_suffix(&[0, 0]).unwrap_or(value);
    value
        .chunks_exact(2)
        .map(|c| {
            let point = u16::from_be_bytes([c[0], c[1]]);
            let refused = point == 0xfffe
                || point == 0xffff
                || (0xfdd0..=0xfdef).contains(&point)
                || (0xd800..=0xdfff).contains(&point);
            (!refused)
                .then(|| char::from_u32(u32::from(point)))
                .flatten()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A DER-encoded certificate whose subject is `rdns` (each RDN a list of (OID, tag,
    /// value bytes)), self-signed by a fresh key.
    fn cert_with(rdns: &[&[(&str, u8, &[u8])]]) -> Vec<u8> {
        // rcgen writes only valid values of a few string types, one per attribute type:
        // the subject is encoded by hand here and spliced into a certificate rcgen made
        // with a placeholder subject. The signature no longer matches, which does not
        // matter: `identity` reads names only (the TLS layer verified the chain).
        let mut params = rcgen::CertificateParams::new(vec!["x".into()]).expect("params");
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "PLACEHOLDER-SUBJECT");
        let key = rcgen::KeyPair::generate().expect("key");
        let der = params.self_signed(&key).expect("cert").der().to_vec();
        let placeholder = der_name(&[&[(CN_OID, 0x0c, b"PLACEHOLDER-SUBJECT")]]);
        let subject = der_name(rdns);
        // The issuer equals the subject in a self-signed certificate: replace the second
        // occurrence (the subject), keeping the issuer as is.
        let first = find(&der, &placeholder).expect("issuer");
        let second = first
            + placeholder.len()
            + find(&der[first + placeholder.len()..], &placeholder).expect("subject");
        let mut tbs_and_rest = der.clone();
        tbs_and_rest.splice(second..second + placeholder.len(), subject.iter().copied());
        // Fix the lengths of the enclosing SEQUENCEs (certificate and tbsCertificate).
        reencode(
            &tbs_and_rest,
            subject.len() as isize - placeholder.len() as isize,
        )
    }

    fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
        hay.windows(needle.len()).position(|w| w == needle)
    }

    fn der_len(n: usize) -> Vec<u8> {
        if n < 128 {
            vec![n as u8]
        } else if n < 256 {
            vec![0x81, n as u8]
        } else {
            vec![0x82, (n >> 8) as u8, n as u8]
        }
    }

    fn tlv(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut v = vec![tag];
        v.extend(der_len(body.len()));
        v.extend_from_slice(body);
        v
    }

    fn oid(dotted: &str) -> Vec<u8> {
        let parts: Vec<u64> = dotted.split('.').map(|p| p.parse().expect("oid")).collect();
        let mut body = vec![(parts[0] * 40 + parts[1]) as u8];
        for &p in &parts[2..] {
            let mut bytes = vec![(p & 0x7f) as u8];
            let mut rest = p >> 7;
            while rest > 0 {
                bytes.push(((rest & 0x7f) as u8) | 0x80);
                rest >>= 7;
            }
            bytes.reverse();
            body.extend(bytes);
        }
        tlv(0x06, &body)
    }

    fn der_name(rdns: &[&[(&str, u8, &[u8])]]) -> Vec<u8> {
        let mut seq = Vec::new();
        for rdn in rdns {
            let mut set = Vec::new();
            for (o, tag, value) in *rdn {
                let mut atv = oid(o);
                atv.extend(tlv(*tag, value));
                set.extend(tlv(0x30, &atv));
            }
            seq.extend(tlv(0x31, &set));
        }
        tlv(0x30, &seq)
    }

    /// Re-encodes the outer certificate SEQUENCE and the tbsCertificate SEQUENCE with their
    /// lengths changed by `delta`.
    fn reencode(der: &[u8], delta: isize) -> Vec<u8> {
        let (outer_len, outer_hdr) = read_len(&der[1..]);
        let inner = &der[1 + outer_hdr..];
        let (tbs_len, tbs_hdr) = read_len(&inner[1..]);
        let tbs_body = &inner[1 + tbs_hdr..1 + tbs_hdr + (tbs_len as isize + delta) as usize];
        let rest = &inner[1 + tbs_hdr + (tbs_len as isize + delta) as usize..];
        let _ = outer_len;
        let mut body = tlv(0x30, tbs_body);
        body.extend_from_slice(rest);
        tlv(0x30, &body)
    }

    fn read_len(b: &[u8]) -> (usize, usize) {
        match b[0] {
            n if n < 0x80 => (n as usize, 1),
            0x81 => (b[1] as usize, 2),
            0x82 => (((b[1] as usize) << 8) | b[2] as usize, 3),
            _ => panic!("length"),
        }
    }

    const UTF8: u8 = 0x0c;
    const PRINTABLE: u8 = 0x13;
    const T61: u8 = 0x14;
    const IA5: u8 = 0x16;
    const BMP: u8 = 0x1e;
    const NUMERIC: u8 = 0x12;
    const OCTETS: u8 = 0x04;

    fn user(name: &str, groups: &[&str], uid: &str) -> (String, Vec<String>, String) {
        (
            name.into(),
            groups.iter().map(|g| g.to_string()).collect(),
            uid.into(),
        )
    }

    #[test]
    fn subjects_read_as_go_reads_them_table() {
        type Rdns<'a> = Vec<&'a [(&'a str, u8, &'a [u8])]>;
        // (subject, expected (user, groups, uid) | Nobody | error kind)
        let ok = |u| Ok(Some(u));
        type Want = Result<Option<(String, Vec<String>, String)>, &'static str>;
        let cases: Vec<(&str, Rdns, Want)> = vec![
            (
                "CN and O",
                vec![
                    &[(CN_OID, UTF8, b"system:node:n1")],
                    &[(O_OID, UTF8, b"system:nodes")],
                ],
                ok(user("system:node:n1", &["system:nodes"], "")),
            ),
            (
                "the last CN wins",
                vec![
                    &[(CN_OID, UTF8, b"system:node:n1")],
                    &[(CN_OID, UTF8, b"system:node:n2")],
                ],
                ok(user("system:node:n2", &[], "")),
            ),
            (
                "a multi-valued RDN is flattened in order",
                vec![
                    &[
                        (CN_OID, UTF8, b"a"),
                        (O_OID, UTF8, b"g1"),
                        (CN_OID, UTF8, b"b"),
                    ],
                    &[(O_OID, UTF8, b"g2")],
                ],
                ok(user("b", &["g1", "g2"], "")),
            ),
            (
                "an empty CN after a name: no identity",
                vec![&[(CN_OID, UTF8, b"admin")], &[(CN_OID, UTF8, b"")]],
                Ok(None),
            ),
            (
                "no CN: no identity",
                vec![&[(O_OID, UTF8, b"system:masters")]],
                Ok(None),
            ),
            (
                "string types: PrintableString, T61 (Latin-1), IA5, BMP, Numeric",
                vec![
                    &[(CN_OID, T61, b"caf\xe9")],
                    &[(O_OID, PRINTABLE, b"a-b*&")],
                    &[(O_OID, IA5, b"ia5")],
                    &[(O_OID, BMP, b"\x00g\x00r\x00p")],
                    &[(O_OID, NUMERIC, b"12 3")],
                ],
                ok(user("caf\u{e9}", &["a-b*&", "ia5", "grp", "12 3"], "")),
            ),
            (
                "a UID",
                vec![&[(CN_OID, UTF8, b"alice")], &[(UID_OID, UTF8, b"u-1")]],
                ok(user("alice", &[], "u-1")),
            ),
            (
                "two UIDs fail authentication",
                vec![
                    &[(CN_OID, UTF8, b"alice")],
                    &[(UID_OID, UTF8, b"u-1")],
                    &[(UID_OID, UTF8, b"u-2")],
                ],
                Err("authentication"),
            ),
            (
                "an empty UID fails authentication",
                vec![&[(CN_OID, UTF8, b"alice")], &[(UID_OID, UTF8, b"")]],
                Err("authentication"),
            ),
            (
                "a value of another type: Go refuses the certificate",
                vec![&[(CN_OID, UTF8, b"alice")], &[("2.5.4.11", OCTETS, b"x")]],
                Err("unparsable"),
            ),
            (
                "an invalid PrintableString",
                vec![&[(CN_OID, PRINTABLE, b"a_b")]],
                Err("unparsable"),
            ),
            (
                "invalid UTF-8",
                vec![&[(CN_OID, UTF8, b"\xff")]],
                Err("unparsable"),
            ),
            (
                "IA5 beyond ASCII",
                vec![&[(CN_OID, IA5, b"\xe9")]],
                Err("unparsable"),
            ),
            (
                "a BMP surrogate",
                vec![&[(CN_OID, BMP, b"\xd8\x00")]],
                Err("unparsable"),
            ),
            (
                "NumericString letters",
                vec![&[(CN_OID, NUMERIC, b"1a")]],
                Err("unparsable"),
            ),
        ];
        for (what, rdns, want) in cases {
            let der = cert_with(&rdns);
            let got = match identity(&der) {
                Ok(Identity::User {
                    name,
                    uid,
                    groups,
                    extra,
                }) => {
                    let id = &extra[CREDENTIAL_ID][0];
                    assert!(
                        id.starts_with("X509SHA256=") && id.len() == 11 + 64,
                        "{what}: {id}"
                    );
                    Ok(Some((name, groups, uid)))
                }
                Ok(Identity::Nobody) => Ok(None),
                Err(Error::Authentication(_)) => Err("authentication"),
                Err(Error::Unparsable(_)) => Err("unparsable"),
            };
            assert_eq!(got, want, "{what}");
            assert_eq!(
                go_parses_names(&der).is_ok(),
                want != Err("unparsable"),
                "{what}: the handshake check"
            );
        }
        assert!(matches!(
            identity(b"not a certificate"),
            Err(Error::Unparsable(_))
        ));
    }

    #[test]
    fn the_credential_id_is_the_leafs_sha256() {
        let der = cert_with(&[&[(CN_OID, UTF8, b"alice")]]);
        let Ok(Identity::User { extra, .. }) = identity(&der) else {
            panic!("an identity");
        };
        let digest = ring::digest::digest(&ring::digest::SHA256, &der);
        let hex: String = digest.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(extra[CREDENTIAL_ID], vec![format!("X509SHA256={hex}")]);
    }
}
