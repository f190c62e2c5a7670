//! Splitting a watch response body into lines, one JSON event each.
//!
//! kube-rs decodes watch bodies with a `FramedRead` whose buffer starts at 8 KiB and
//! stays for the stream's lifetime; with one upstream watch per key that is 8 KiB per key
//! held for nothing, as most events are far smaller and arrive whole in one body frame.
//! This splitter holds only an incomplete line's bytes between frames, hands out complete
//! lines as slices of the frame they arrived in (no copy), and bounds a line's size.

use bytes::{Buf, Bytes, BytesMut};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("watch event line longer than {max} bytes")]
    LineTooLong { max: usize },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Incomplete-line state between body frames.
#[derive(Debug)]
pub struct Lines {
    partial: BytesMut,
    max: usize,
}

impl Lines {
    /// Lines up to `max` bytes; a longer one is an error (the stream is then abandoned).
    pub fn new(max: usize) -> Self {
        Lines {
            partial: BytesMut::new(),
            max,
        }
    }

    /// Feeds one body frame; complete, non-empty lines (without `\n`) are appended to
    /// `out` in order.
    pub fn push(&mut self, mut frame: Bytes, out: &mut impl Extend<Bytes>) -> Result<()> {
        while let Some(i) = frame.iter().position(|&b| b == b'\n') {
            let head = frame.split_to(i);
            frame.advance(1);
            let line = if self.partial.is_empty() {
                head
            } else {
                self.check(head.len())?;
                self.partial.extend_from_slice(&head);
                // Hand the bytes over and let the buffer go: a big event must not leave
                // its capacity behind for the life of the watch.
                std::mem::take(&mut self.partial).freeze()
            };
            if !line.iter().all(u8::is_ascii_whitespace) {
                if line.len() > self.max {
                    return Err(Error::LineTooLong { max: self.max });
                }
                out.extend(Some(line));
            }
        }
        if !frame.is_empty() {
            self.check(frame.len())?;
            self.partial.extend_from_slice(&frame);
        }
        Ok(())
    }

    /// Bytes of an incomplete line held (e.g. at the end of the stream).
    pub fn pending(&self) -> usize {
        self.partial.len()
    }

    fn check(&self, more: usize) -> Result<()> {
        if self.partial.len() + more > self.max {
            Err(Error::LineTooLong { max: self.max })
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(l: &mut Lines, frames: &[&str]) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for f in frames {
            l.push(Bytes::copy_from_slice(f.as_bytes()), &mut out)?;
        }
        Ok(out
            .iter()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .collect())
    }

    #[test]
    fn whole_lines_in_one_frame_are_not_copied() {
        let mut l = Lines::new(1024);
        let frame = Bytes::from_static(b"{\"a\":1}\n{\"b\":2}\n");
        let mut out = Vec::new();
        l.push(frame.clone(), &mut out).expect("push");
        assert_eq!(out, vec![frame.slice(0..7), frame.slice(8..15)]);
        // The first line is a view into the frame's own allocation.
        assert_eq!(out[0].as_ptr(), frame.as_ptr());
        assert_eq!(l.pending(), 0);
    }

    #[test]
    fn lines_split_across_frames_are_joined() {
        let mut l = Lines::new(1024);
        let out = feed(&mut l, &["{\"a\":", "1}\n{\"b\"", ":2}", "\n"]).expect("lines");
        assert_eq!(out, vec!["{\"a\":1}", "{\"b\":2}"]);
        assert_eq!(l.pending(), 0);
        assert_eq!(l.partial.capacity(), 0, "the join buffer is released");
    }

    #[test]
    fn blank_lines_are_skipped_and_a_tail_waits() {
        let mut l = Lines::new(1024);
        let out = feed(&mut l, &["\n\r\n{}\n", "  \n{\"x\""]).expect("lines");
        assert_eq!(out, vec!["{}"]);
        assert_eq!(l.pending(), 4);
    }

    #[test]
    fn a_line_over_the_limit_is_an_error() {
        let mut l = Lines::new(8);
        assert_eq!(
            feed(&mut l, &["0123456789\n"]),
            Err(Error::LineTooLong { max: 8 })
        );
        let mut l = Lines::new(8);
        assert_eq!(
            feed(&mut l, &["01234", "56789"]),
            Err(Error::LineTooLong { max: 8 })
        );
        let mut l = Lines::new(8);
        assert_eq!(
            feed(&mut l, &["0123", "4567\n"]).expect("fits"),
            vec!["01234567"]
        );
    }
}
