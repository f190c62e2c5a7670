//! Noticing that a client left while its response is idle.
//!
//! A proxied watch that has nothing to send writes nothing, so a client that closed its
//! connection is only found out by reading — which an HTTP/1.1 server that is streaming a
//! response does not always do — and until then the proxied watch holds its upstream
//! request and its long-running slot. Go's server (so the API server) notices at once
//! (its connection reader sees the EOF). kcache keeps a duplicate of each connection's
//! socket and asks the kernel, without reading anything, whether the peer hung up
//! (`poll(2)` with `POLLRDHUP`): what `curl` closing, a kubelet restarting or an informer
//! giving up all look like.
//!
//! Limits: on HTTP/2 it sees the whole connection go, not one stream's reset (actix-web
//! does not surface RST_STREAM to a response that is waiting for its body); each
//! connection holds a second file descriptor; Linux only (elsewhere it never fires).

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

/// A duplicate of a connection's socket, kept in the connection's data (`on_connect`);
/// it closes with the last clone.
#[derive(Clone, Debug)]
pub struct ConnSocket(Arc<OwnedFd>);

impl ConnSocket {
    pub fn of(stream: &impl AsFd) -> Option<Self> {
        stream
            .as_fd()
            .try_clone_to_owned()
            .ok()
            .map(|fd| ConnSocket(Arc::new(fd)))
    }

    /// Whether the peer closed its side (FIN) or the connection failed (reset). Reads
    /// nothing: data the server has not read yet stays where it is.
    #[cfg(target_os = "linux")]
    pub fn peer_closed(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLRDHUP,
            revents: 0,
        };
        // SAFETY: `p` is one valid pollfd for an fd this value owns; a zero timeout
        // makes the call a non-blocking check.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n > 0 && p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
    }

    #[cfg(not(target_os = "linux"))]
    pub fn peer_closed(&self) -> bool {
        false
    }

    /// Resolves once the peer closed, checking every `every`.
    pub async fn closed(self, every: Duration) {
        while !self.peer_closed() {
            tokio::time::sleep(every).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn a_peers_close_is_seen_without_reading_what_it_sent() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let mut client = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (server, _) = listener.accept().expect("accept");
        let sock = ConnSocket::of(&server).expect("dup");
        assert!(!sock.peer_closed());
        // Unread data is not a hang-up.
        client.write_all(b"GET / HTTP/1.1\r\n").expect("write");
        std::thread::sleep(Duration::from_millis(50));
        assert!(!sock.peer_closed());
        drop(client);
        std::thread::sleep(Duration::from_millis(50));
        assert!(sock.peer_closed());
        // Still unread: the check consumed nothing.
        let mut buf = [0u8; 64];
        let n = std::io::Read::read(&mut &server, &mut buf).expect("read");
        assert_eq!(&buf[..n], b"GET / HTTP/1.1\r\n");
    }
}
