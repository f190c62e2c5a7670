//! Splitting a list response body into its items as the body arrives.
//!
//! A list of 100,000 objects is a 140 MB body. Reading it whole before parsing holds the
//! body, its frames and the parsed objects at once, and the allocator keeps most of that
//! peak in the process's RSS for good. This splitter holds only an incomplete item's bytes
//! between body frames (as `core::lines` does for watch lines), hands out each complete
//! item as a slice of the frame it arrived in, and keeps the list's `metadata` for its
//! resourceVersion. Items are not checked here: each is parsed by `core::object`, which
//! refuses what is not a valid object.

use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use serde_json::value::RawValue;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("list body is not a JSON list: {0}")]
    Syntax(&'static str),
    #[error("list item or member longer than {max} bytes")]
    TooLong { max: usize },
    #[error("list body ended early")]
    Truncated,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The most bytes of a top-level member other than `items` that is kept (`metadata`).
const MAX_MEMBER: usize = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before the top-level `{`.
    Start,
    /// Expecting a member's key (or `}` when `first`).
    Member {
        first: bool,
    },
    Key,
    Colon,
    /// Expecting a member's value.
    ValueStart,
    /// Inside a member's value (kept when the member is `metadata`).
    Value,
    /// Inside `items`, expecting an item (or `]` when `first`).
    Items {
        first: bool,
    },
    /// Inside an item.
    Item,
    /// After an item: `,` or `]`.
    AfterItem,
    /// After a member: `,` or `}`.
    AfterMember,
    End,
}

/// Where a JSON value being scanned stands.
#[derive(Debug, Clone, Copy, Default)]
struct Scan {
    depth: u32,
    in_str: bool,
    esc: bool,
    /// A number, `true`, `false` or `null`: ends at the first delimiter.
    scalar: bool,
}

impl Scan {
    /// Starts a value at `b`; `true` when `b` alone completes it (never: a string or
    /// container needs its closing byte, a scalar its delimiter).
    fn start(b: u8) -> Self {
        match b {
            b'{' | b'[' => Scan {
                depth: 1,
                ..Scan::default()
            },
            b'"' => Scan {
                in_str: true,
                ..Scan::default()
            },
            _ => Scan {
                scalar: true,
                ..Scan::default()
            },
        }
    }

    /// Feeds the byte after the start; `Some(true)` when it completes the value (it is
    /// part of it), `Some(false)` when it ends a scalar (it is not), `None` otherwise.
    fn feed(&mut self, b: u8) -> Option<bool> {
        if self.scalar {
            return matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\r' | b'\n').then_some(false);
        }
        if self.in_str {
            if self.esc {
                self.esc = false;
            } else if b == b'\\' {
                self.esc = true;
            } else if b == b'"' {
                self.in_str = false;
                return (self.depth == 0).then_some(true);
            }
            return None;
        }
        match b {
            b'"' => self.in_str = true,
            b'{' | b'[' => self.depth += 1,
            b'}' | b']' => {
                self.depth = self.depth.saturating_sub(1);
                return (self.depth == 0).then_some(true);
            }
            _ => {}
        }
        None
    }
}

/// The state between body frames.
#[derive(Debug)]
pub struct ListSplitter {
    state: State,
    scan: Scan,
    /// The current key, item or kept member value so far.
    buf: BytesMut,
    /// The current member's key (raw, as between the quotes).
    key: Vec<u8>,
    keep: bool,
    metadata: Option<Bytes>,
    max: usize,
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

impl ListSplitter {
    /// Items up to `max` bytes; a longer one is an error.
    pub fn new(max: usize) -> Self {
        ListSplitter {
            state: State::Start,
            scan: Scan::default(),
            buf: BytesMut::new(),
            key: Vec::new(),
            keep: false,
            metadata: None,
            max,
        }
    }

    /// Feeds one body frame; complete items are appended to `out` in order.
    pub fn push(&mut self, frame: Bytes, out: &mut impl Extend<Bytes>) -> Result<()> {
        // Where the current item or kept value starts in this frame, if it does.
        let mut start: Option<usize> = None;
        let mut i = 0;
        while i < frame.len() {
            let b = frame[i];
            match self.state {
                State::Start => match b {
                    b'{' => self.state = State::Member { first: true },
                    b if is_ws(b) => {}
                    _ => return Err(Error::Syntax("not an object")),
                },
                State::Member { first } => match b {
                    b'"' => {
                        self.state = State::Key;
                        self.scan = Scan::start(b);
                        self.key.clear();
                    }
                    b'}' if first => self.state = State::End,
                    b if is_ws(b) => {}
                    _ => return Err(Error::Syntax("expected a member")),
                },
                State::Key => match self.scan.feed(b) {
                    Some(_) => self.state = State::Colon,
                    None => {
                        if self.key.len() >= MAX_MEMBER {
                            return Err(Error::TooLong { max: MAX_MEMBER });
                        }
                        self.key.push(b);
                    }
                },
                State::Colon => match b {
                    b':' => self.state = State::ValueStart,
                    b if is_ws(b) => {}
                    _ => return Err(Error::Syntax("expected ':'")),
                },
                State::ValueStart if is_ws(b) => {}
                State::ValueStart if self.key == b"items" => match b {
                    b'[' => self.state = State::Items { first: true },
                    b'n' => {
                        // `"items":null`: no items.
                        self.scan = Scan::start(b);
                        self.keep = false;
                        self.state = State::Value;
                    }
                    _ => return Err(Error::Syntax("items is not an array")),
                },
                State::ValueStart => {
                    self.scan = Scan::start(b);
                    self.keep = self.key == b"metadata";
                    self.buf.clear();
                    start = Some(i);
                    self.state = State::Value;
                }
                State::Value => match self.scan.feed(b) {
                    None => {}
                    Some(inclusive) => {
                        let end = if inclusive { i + 1 } else { i };
                        if self.keep {
                            let value = self.take(&frame, start.take(), end, MAX_MEMBER)?;
                            self.metadata = Some(value);
                        }
                        start = None;
                        self.state = State::AfterMember;
                        if !inclusive {
                            // The delimiter belongs to what follows.
                            continue;
                        }
                    }
                },
                State::AfterMember => match b {
                    b',' => self.state = State::Member { first: false },
                    b'}' => self.state = State::End,
                    b if is_ws(b) => {}
                    _ => return Err(Error::Syntax("expected ',' or '}'")),
                },
                State::Items { first } => match b {
                    b'{' => {
                        self.scan = Scan::start(b);
                        self.buf.clear();
                        start = Some(i);
                        self.state = State::Item;
                    }
                    b']' if first => self.state = State::AfterMember,
                    b if is_ws(b) => {}
                    _ => return Err(Error::Syntax("an item is not an object")),
                },
                State::Item => {
                    if self.scan.feed(b) == Some(true) {
                        let item = self.take(&frame, start.take(), i + 1, self.max)?;
                        out.extend(Some(item));
                        self.state = State::AfterItem;
                    }
                }
                State::AfterItem => match b {
                    b',' => self.state = State::Items { first: false },
                    b']' => self.state = State::AfterMember,
                    b if is_ws(b) => {}
                    _ => return Err(Error::Syntax("expected ',' or ']'")),
                },
                State::End => {
                    if !is_ws(b) {
                        return Err(Error::Syntax("data after the list"));
                    }
                }
            }
            i += 1;
        }
        // An item or kept value continues in the next frame: keep its bytes so far.
        if matches!(self.state, State::Item) || (self.state == State::Value && self.keep) {
            let from = start.unwrap_or(0);
            let limit = if self.state == State::Item {
                self.max
            } else {
                MAX_MEMBER
            };
            if self.buf.len() + (frame.len() - from) > limit {
                return Err(Error::TooLong { max: limit });
            }
            self.buf.extend_from_slice(&frame[from..]);
        }
        Ok(())
    }

    /// The value that ends at `end` in `frame`: a slice of the frame when it started
    /// there, else the bytes kept from earlier frames and this frame's part.
    fn take(
        &mut self,
        frame: &Bytes,
        start: Option<usize>,
        end: usize,
        max: usize,
    ) -> Result<Bytes> {
        let value = match start {
            Some(s) => frame.slice(s..end),
            None => {
                self.buf.extend_from_slice(&frame[..end]);
                // Hand the bytes over and let the buffer go.
                std::mem::take(&mut self.buf).freeze()
            }
        };
        if value.len() > max {
            return Err(Error::TooLong { max });
        }
        Ok(value)
    }

    /// The body ended: the list's `metadata.resourceVersion` (`None` when it has none or
    /// it is not a number), or an error when the body was incomplete.
    pub fn finish(self) -> Result<Option<u64>> {
        if self.state != State::End {
            return Err(Error::Truncated);
        }
        #[derive(Deserialize)]
        struct Meta<'a> {
            #[serde(rename = "resourceVersion", borrow, default)]
            resource_version: Option<&'a RawValue>,
        }
        let Some(meta) = self.metadata else {
            return Ok(None);
        };
        let Ok(Meta {
            resource_version: Some(raw),
        }) = serde_json::from_slice::<Meta>(&meta)
        else {
            return Ok(None);
        };
        Ok(serde_json::from_str::<String>(raw.get())
            .ok()
            .and_then(|s| s.parse().ok()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split_at_every(body: &[u8], step: usize) -> Result<(Vec<String>, Option<u64>)> {
        let mut s = ListSplitter::new(1 << 20);
        let mut items = Vec::new();
        for chunk in body.chunks(step.max(1)) {
            s.push(Bytes::copy_from_slice(chunk), &mut items)?;
        }
        let rv = s.finish()?;
        let items = items
            .into_iter()
            .map(|b| String::from_utf8(b.to_vec()).expect("utf8"))
            .collect();
        Ok((items, rv))
    }

    #[test]
    fn items_come_out_whatever_the_frames() {
        let body = br#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"42","x":"}\"]"},"items":[{"metadata":{"name":"a"},"data":{"k":"v}]\\\"{"}},  {"n":[1,{"a":[]}],"s":"\u00e9"} ,{}],"extra":[1,2,{"items":[]}],"num":12.5e3,"t":true}"#;
        for step in [1, 2, 3, 7, 16, body.len()] {
            let (items, rv) = split_at_every(body, step).unwrap_or_else(|e| panic!("{step}: {e}"));
            assert_eq!(rv, Some(42), "{step}");
            assert_eq!(
                items,
                [
                    r#"{"metadata":{"name":"a"},"data":{"k":"v}]\\\"{"}}"#,
                    r#"{"n":[1,{"a":[]}],"s":"\u00e9"}"#,
                    "{}"
                ],
                "{step}"
            );
        }
    }

    #[test]
    fn lists_without_items_or_rv() {
        for (body, want_rv) in [
            (&br#"{"metadata":{},"items":[]}"#[..], None),
            (
                br#"{"items":null,"metadata":{"resourceVersion":"7"}}"#,
                Some(7),
            ),
            (br#" { } "#, None),
            (br#"{"metadata":{"resourceVersion":"x"},"items":[]}"#, None),
            (br#"{"metadata":{"resourceVersion":5},"items":[]}"#, None),
            (br#"{"metadata":null}"#, None),
        ] {
            let (items, rv) = split_at_every(body, 3).unwrap_or_else(|e| panic!("{e}"));
            assert!(items.is_empty());
            assert_eq!(rv, want_rv, "{}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn broken_bodies_are_errors() {
        for body in [
            &b""[..],
            b"[",
            b"[]",
            br#"{"items":[{"a":1}"#,
            br#"{"items":[1]}"#,
            br#"{"items":{}}"#,
            br#"{"items":[{}}"#,
            br#"{"items":[{}] x"#,
            br#"{"items":[]} x"#,
            br#"{"a" 1}"#,
            br#"{,"items":[]}"#,
            br#"{"items":[,{}]}"#,
        ] {
            assert!(
                split_at_every(body, 2).is_err(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn items_are_bounded() {
        let mut s = ListSplitter::new(8);
        let mut out = Vec::new();
        let r = s.push(
            Bytes::from_static(br#"{"items":[{"a":"0123456789"}]}"#),
            &mut out,
        );
        assert_eq!(r, Err(Error::TooLong { max: 8 }));
        let mut s = ListSplitter::new(8);
        let mut out = Vec::new();
        s.push(Bytes::from_static(br#"{"items":[{"a":"#), &mut out)
            .expect("first part fits");
        let r = s.push(Bytes::from_static(br#""0123456789"}]}"#), &mut out);
        assert_eq!(r, Err(Error::TooLong { max: 8 }));
    }

    #[test]
    fn a_whole_item_in_one_frame_is_a_slice_of_it() {
        let frame = Bytes::from_static(br#"{"items":[{"a":1}]}"#);
        let mut s = ListSplitter::new(64);
        let mut out = Vec::new();
        s.push(frame.clone(), &mut out).expect("list");
        assert_eq!(out[0].as_ptr(), frame[10..].as_ptr());
    }
}
