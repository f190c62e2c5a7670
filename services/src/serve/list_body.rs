//! List bodies written as they are produced: the head, the items' own cached bytes in
//! chunks, the tail — JSON and protobuf — with the length known up front.

use std::sync::Arc;

use actix_web::HttpResponse;
use bytes::Bytes;
use kcache_actors::core::object::{self, Object};
use kcache_actors::core::proto::{self, Codec};

use crate::fairness::Seat;

/// Longest a list's body keeps its seat: the API server's request timeout, which ends its
/// own seat's hold. A client that stops reading keeps its connection, not the seat.
const SEAT_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Held by a body while it is written; dropping it (the body ended, or its client left)
/// frees the seat.
pub struct SeatHeld(#[allow(dead_code)] tokio::sync::oneshot::Sender<()>);

/// Hands `seat` to a task that frees it when the body's [`SeatHeld`] is dropped, or after
/// [`SEAT_LIMIT`], whichever comes first: a body that is not read is not polled, so it
/// cannot free the seat itself.
fn hold_seat(seat: Seat) -> SeatHeld {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    actix_rt::spawn(async move {
        let _ = tokio::time::timeout(SEAT_LIMIT, rx).await;
        drop(seat);
    });
    SeatHeld(tx)
}

/// How many bytes of items a list writes at a time.
const LIST_CHUNK: usize = 64 << 10;

/// A list's body, written as it is produced: the head, the items' own bytes in chunks of
/// [`LIST_CHUNK`], the tail. Nothing is built whole: a list of 100,000 objects costs its
/// snapshot (a pointer per object) and one chunk, not a second copy of every object. The
/// length is known up front, so the response carries `Content-Length` as the API
/// server's does.
pub fn list_response(
    head: Bytes,
    (items, strip_type_meta): (Vec<Arc<Object>>, bool),
    seat: Option<Seat>,
) -> HttpResponse {
    let commas = items.len().saturating_sub(1);
    let len = head.len()
        + items
            .iter()
            .map(|o| object::list_item_len(o.json(), strip_type_meta))
            .sum::<usize>()
        + commas
        + object::LIST_TAIL.len();
    struct St {
        head: Option<Bytes>,
        items: std::vec::IntoIter<Arc<Object>>,
        writer: Option<object::ListWriter>,
        /// The seat's hold (`hold_seat`): freed with the body.
        _seat: Option<SeatHeld>,
    }
    let st = St {
        head: Some(head),
        items: items.into_iter(),
        writer: Some(object::ListWriter::new(LIST_CHUNK)),
        _seat: seat.map(hold_seat),
    };
    let stream = futures::stream::unfold(st, move |mut st| async move {
        if let Some(head) = st.head.take() {
            return Some((Ok::<_, std::convert::Infallible>(head), st));
        }
        let writer = st.writer.as_mut()?;
        for o in st.items.by_ref() {
            if let Some(chunk) = writer.push_item(o.json(), strip_type_meta) {
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
    (rv, more): (u64, Option<(&str, Option<u64>)>),
    messages: Vec<Bytes>,
    seat: Option<Seat>,
) -> HttpResponse {
    let (head, tail) = codec.list_head(rv, more, messages.iter().map(Bytes::len));
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
        _seat: Option<SeatHeld>,
    }
    let st = St {
        head: Some(head),
        messages: messages.into_iter(),
        tail: Some(tail),
        _seat: seat.map(hold_seat),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fairness::Fairness;
    use std::time::Duration;

    /// A body that ends frees its seat at once; one whose client stops reading frees it
    /// after SEAT_LIMIT, though the body itself is never polled again.
    #[actix_rt::test]
    async fn a_list_body_frees_its_seat_when_done_or_at_the_limit() {
        let f = Fairness::new(1, 10, 0, Duration::from_secs(3600));
        let held = hold_seat(f.seat("a").await.expect("seat"));
        drop(held);
        let next = tokio::time::timeout(Duration::from_secs(5), f.seat("b")).await;
        let held = hold_seat(next.expect("freed when the body ended").expect("seat"));
        tokio::time::pause();
        let waiter = {
            let f = f.clone();
            actix_rt::spawn(async move { f.seat("c").await.map(|_| ()) })
        };
        tokio::time::advance(SEAT_LIMIT + Duration::from_secs(1)).await;
        waiter
            .await
            .expect("join")
            .expect("freed at the limit while the body is still held");
        drop(held);
    }
}
