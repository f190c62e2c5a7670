//! The HTTP stack under kcache's watches: actix-http's HTTP/2 dispatcher gives a streamed
//! response's head back as soon as the head is sent, not when the body ends. A watch's body
//! lasts as long as the watch, and a held head (its header map, its extensions) was ~0.8 KB
//! of every open watch (issue 31.1). Upstream actix-http 3.20.0 holds it; kcache builds
//! against the copy in `vendor/actix-http`, which does not (`vendor/README.md`). This test
//! fails if the workspace ever builds the unpatched crate again. The copy also sends a
//! body from a smaller task (`SendBody`): a body larger than the stream's flow-control
//! window, in chunks of every size, must still arrive whole and end.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::{web, App, HttpResponse, HttpServer};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};

/// Sets its flag when dropped: carried in a response's extensions, which live and die
/// with its head.
struct DroppedWithHead(Arc<AtomicBool>);

impl Drop for DroppedWithHead {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// An actix-web server on 127.0.0.1:0 speaking HTTP/2 with prior knowledge (detected by its
/// preface) with `app`'s routes, and an HTTP/2 client connection to it.
async fn serve<F>(
    app: F,
) -> (
    std::net::SocketAddr,
    actix_web::dev::ServerHandle,
    hyper::client::conn::http2::SendRequest<Empty<Bytes>>,
)
where
    F: Fn(&mut web::ServiceConfig) + Send + Clone + 'static,
{
    let server = HttpServer::new(move || App::new().configure(app.clone()))
        .workers(1)
        .bind_auto_h2c(("127.0.0.1", 0))
        .expect("bind 127.0.0.1:0");
    let addr = server.addrs()[0];
    let server = server.run();
    let handle = server.handle();
    actix_web::rt::spawn(server);
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (send, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
            .await
            .expect("HTTP/2 handshake");
    actix_web::rt::spawn(conn);
    (addr, handle, send)
}

#[actix_web::test]
async fn a_streamed_http2_body_arrives_whole_and_ends() {
    // An empty chunk, small ones, and one of 300 KB: more than the default 64 KB stream
    // window and many times the dispatcher's 16 KB piece, so it goes out as capacity
    // comes back.
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let chunks = vec![
        Bytes::from_static(b"first\n"),
        Bytes::new(),
        Bytes::from(big),
        Bytes::from_static(b"\n"),
        Bytes::from_static(b"last\n"),
    ];
    let want: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
    let (addr, handle, mut send) = serve(move |cfg: &mut web::ServiceConfig| {
        let chunks = chunks.clone();
        cfg.route(
            "/stream",
            web::get().to(move || {
                let chunks = chunks.clone();
                async move {
                    let body =
                        futures::stream::iter(chunks.into_iter().map(Ok::<Bytes, Infallible>));
                    HttpResponse::Ok().streaming(body)
                }
            }),
        );
    })
    .await;
    let req = http::Request::get(format!("http://{addr}/stream"))
        .body(Empty::<Bytes>::new())
        .expect("request");
    let res = send.send_request(req).await.expect("response head");
    assert_eq!(res.status(), 200);
    let got = tokio::time::timeout(Duration::from_secs(30), res.into_body().collect())
        .await
        .expect("the body ends")
        .expect("the body arrives")
        .to_bytes();
    assert_eq!(got.len(), want.len());
    assert!(got == want, "the body arrived altered");
    handle.stop(false).await;
}

#[actix_web::test]
async fn a_streamed_http2_response_gives_its_head_back_once_sent() {
    let head_dropped = Arc::new(AtomicBool::new(false));
    let flag = head_dropped.clone();
    let (addr, handle, mut send) = serve(move |cfg: &mut web::ServiceConfig| {
        let flag = flag.clone();
        cfg.route(
            "/watch",
            web::get().to(move || {
                let flag = flag.clone();
                async move {
                    // A body that never ends, as a quiet watch's.
                    let body = futures::stream::pending::<Result<Bytes, Infallible>>();
                    let mut res = HttpResponse::Ok()
                        .content_type("application/json")
                        .streaming(body);
                    res.extensions_mut().insert(DroppedWithHead(flag));
                    res
                }
            }),
        );
    })
    .await;
    let req = http::Request::get(format!("http://{addr}/watch"))
        .body(Empty::<Bytes>::new())
        .expect("request");
    let res = send.send_request(req).await.expect("response head");
    assert_eq!(res.status(), 200);
    assert_eq!(res.version(), http::Version::HTTP_2);

    // The head arrived and the body is still open: the server has let go of the head.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !head_dropped.load(Ordering::SeqCst) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        head_dropped.load(Ordering::SeqCst),
        "actix-http still holds a streamed response's head while its body is open: is \
         vendor/actix-http patched in (Cargo.toml [patch.crates-io])?"
    );
    let mut body = res.into_body();
    let next = tokio::time::timeout(Duration::from_millis(200), body.frame()).await;
    assert!(next.is_err(), "the body is still open: {next:?}");

    handle.stop(false).await;
}
