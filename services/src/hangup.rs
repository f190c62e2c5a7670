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
//! Each connection keeps only what finds its socket again ([`ConnFd`]: the descriptor's
//! number and the connection's two addresses, read when it was accepted). The duplicate
//! is made when a response needs it, a proxied long-running one, and checked to be that
//! connection's socket. Duplicating every connection's socket at accept held two file
//! descriptors per connection: a replica under a 20,000 open-file limit stopped accepting
//! at ~9,970 connections (the million-watch benchmark's 30,000 nodes over 3 replicas).
//!
//! Limits: on HTTP/2 it sees the whole connection go, not one stream's reset (actix-web
//! does not surface RST_STREAM to a response that is waiting for its body); Linux only
//! (elsewhere it never fires).

use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

/// How a connection's socket is found again, kept in the connection's data
/// (`on_connect`): no descriptor until a response asks for one, then one for the
/// connection, shared by its responses while any holds it.
#[derive(Clone, Debug)]
pub struct ConnFd {
    fd: RawFd,
    local: SocketAddr,
    peer: SocketAddr,
    /// The duplicate its responses share (many proxied watches on one HTTP/2 connection).
    dup: Arc<Mutex<Weak<OwnedFd>>>,
}

impl ConnFd {
    /// `stream`'s descriptor number and addresses; none for a socket without both.
    pub fn of(stream: &(impl AsFd + AsRawFd)) -> Option<Self> {
        let s = socket2::SockRef::from(stream);
        Some(ConnFd {
            fd: stream.as_raw_fd(),
            local: s.local_addr().ok()?.as_socket()?,
            peer: s.peer_addr().ok()?.as_socket()?,
            dup: Arc::default(),
        })
    }

    /// A duplicate of the connection's socket, while the connection is open (a request
    /// on it is being served). If it closed meanwhile, its number may already be another
    /// socket's: a duplicate is kept only if its addresses are the connection's, so
    /// another client's socket is never watched in its place.
    pub fn socket(&self) -> Option<ConnSocket> {
        // A poisoned lock only means a panic elsewhere held it; the Weak is still whole.
        let mut shared = self.dup.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(fd) = shared.upgrade() {
            return Some(ConnSocket(fd));
        }
        // SAFETY: fcntl on a plain integer: a closed number fails (EBADF), any other is
        // duplicated into a new descriptor that this function owns from here on.
        let dup = unsafe { libc::fcntl(self.fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return None;
        }
        // SAFETY: `dup` is a new descriptor nothing else owns.
        let stream = TcpStream::from(unsafe { OwnedFd::from_raw_fd(dup) });
        let same = stream.local_addr().ok() == Some(self.local)
            && stream.peer_addr().ok() == Some(self.peer);
        if !same {
            return None;
        }
        let fd = Arc::new(OwnedFd::from(stream));
        *shared = Arc::downgrade(&fd);
        Some(ConnSocket(fd))
    }

    /// The connection's (local, peer) addresses.
    pub fn addresses(&self) -> (SocketAddr, SocketAddr) {
        (self.local, self.peer)
    }
}

/// A duplicate of a connection's socket ([`ConnFd::socket`]); it closes with the last
/// clone.
#[derive(Clone, Debug)]
pub struct ConnSocket(Arc<OwnedFd>);

impl ConnSocket {
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
    use std::net::TcpListener;

    #[test]
    fn a_closed_connections_number_taken_by_another_socket_is_not_duplicated() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let _a = TcpStream::connect(addr).expect("connect");
        let (server_a, _) = listener.accept().expect("accept");
        let conn = ConnFd::of(&server_a).expect("addresses");
        // Open: the duplicate is this connection's socket, one for all its responses.
        let dup = conn.socket().expect("open connection");
        let again = conn.socket().expect("open connection");
        assert_eq!(dup.0.as_raw_fd(), again.0.as_raw_fd());
        drop((dup, again));
        let number = server_a.as_raw_fd();
        drop(server_a);
        // Closed, and (usually) the lowest free number goes to the next socket: the
        // next accepted connection's. Either way no duplicate comes back.
        let _b = TcpStream::connect(addr).expect("connect");
        let (server_b, _) = listener.accept().expect("accept");
        assert!(conn.socket().is_none());
        if server_b.as_raw_fd() == number {
            // The reuse case proper: same number, another connection.
            let b = ConnFd::of(&server_b).expect("addresses");
            assert_ne!(b.addresses(), conn.addresses());
        }
        drop(server_b);
        assert!(conn.socket().is_none());
    }

    #[test]
    fn a_peers_close_is_seen_without_reading_what_it_sent() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let mut client = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (server, _) = listener.accept().expect("accept");
        let sock = ConnFd::of(&server).and_then(|c| c.socket()).expect("dup");
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
