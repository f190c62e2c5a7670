//! List bodies written as they are produced: the head, the items' own cached bytes in
//! chunks, the tail — JSON and protobuf — with the length known up front.

use std::sync::Arc;

use actix_web::HttpResponse;
use bytes::Bytes;
use kcache_actors::core::object::{self, Object};
use kcache_actors::core::proto::{self, Codec};

use crate::fairness::Seat;

/// How many bytes of items a list writes at a time.
const LIST_CHUNK: usize = 64 << 10;

/// A list's body, written as it is produced: the head, the items' own bytes in chunks of
/// [`LIST_CHUNK`], the tail. Nothing is built whole: a list of 100,000 objects costs its
/// snapshot (a pointer per object) and one chunk, not a second copy of every object. The
/// length is known up front, so the response carries `Content-Length` as the API
/// server's does.
pub fn list_response(head: Bytes, items: Vec<Arc<Object>>, seat: Seat) -> HttpResponse {
    let commas = items.len().saturating_sub(1);
    let len = head.len()
        + items.iter().map(|o| o.json().len()).sum::<usize>()
        + commas
        + object::LIST_TAIL.len();
    struct St {
        head: Option<Bytes>,
        items: std::vec::IntoIter<Arc<Object>>,
        writer: Option<object::ListWriter>,
        /// Freed with the body: when its last chunk is written, or its client left.
        _seat: Seat,
    }
    let st = St {
        head: Some(head),
        items: items.into_iter(),
        writer: Some(object::ListWriter::new(LIST_CHUNK)),
        _seat: seat,
    };
    let stream = futures::stream::unfold(st, move |mut st| async move {
        if let Some(head) = st.head.take() {
            return Some((Ok::<_, std::convert::Infallible>(head), st));
        }
        let writer = st.writer.as_mut()?;
        for o in st.items.by_ref() {
            if let Some(chunk) = writer.push(o.json()) {
                return Some((Ok(chunk), st));
            }
        }
        let last = st.writer.take()?.finish();
        if len > kcache_actors::memory::TRIM_AFTER_BYTES {
            // The chunks written so far are freed: return the holes they left.
            kcache_actors::memory::release_freed();
        }
        Some((Ok(last), st))
    });
    HttpResponse::Ok()
        .content_type("application/json")
        .body(actix_web::body::SizedStream::new(len as u64, stream))
}

/// A protobuf list: the envelope's head, each item's field header and message, the tail;
/// chunked as [`list_response`], with its length known up front.
pub fn proto_list_response(
    codec: &Codec,
    rv: u64,
    messages: Vec<Bytes>,
    seat: Seat,
) -> HttpResponse {
    let (head, tail) = codec.list_head(rv, messages.iter().map(Bytes::len));
    let len = head.len()
        + messages
            .iter()
            .map(|m| proto::codec::item_len(m.len()))
            .sum::<usize>()
        + tail.len();
    // Written as it is produced: the messages are the objects' own (cached), and only one
    // chunk of them is copied at a time.
    struct St {
        head: Option<Bytes>,
        messages: std::vec::IntoIter<Bytes>,
        tail: Option<Bytes>,
        _seat: Seat,
    }
    let st = St {
        head: Some(head),
        messages: messages.into_iter(),
        tail: Some(tail),
        _seat: seat,
    };
    let stream = futures::stream::unfold(st, |mut st| async move {
        if let Some(head) = st.head.take() {
            return Some((Ok::<_, std::convert::Infallible>(head), st));
        }
        let tail = st.tail.take()?;
        let mut chunk: Vec<u8> = Vec::with_capacity(LIST_CHUNK);
        for m in st.messages.by_ref() {
            proto::codec::item_prefix(m.len(), &mut chunk);
            chunk.extend_from_slice(&m);
            if chunk.len() >= LIST_CHUNK {
                st.tail = Some(tail);
                return Some((Ok(Bytes::from(chunk)), st));
            }
        }
        chunk.extend_from_slice(&tail);
        Some((Ok(Bytes::from(chunk)), st))
    });
    HttpResponse::Ok()
        .content_type(proto::codec::CONTENT_TYPE)
        .body(actix_web::body::SizedStream::new(len as u64, stream))
}
