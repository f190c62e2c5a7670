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
//! number and the socket's cookie, `SO_COOKIE`, an id the kernel never gives another
//! socket). The duplicate is made when a response needs it, a proxied long-running one,
//! and only of the socket with that cookie. Duplicating every connection's socket at
//! accept held two file descriptors per connection: a replica under a 20,000 open-file
//! limit stopped accepting at ~9,970 connections (the million-watch benchmark's 30,000
//! nodes over 3 replicas).
//!
//! On HTTP/2 a request runs in a task of its own that can outlive its connection, so by
//! the time it asks, the number may be closed or another socket's: the cookie tells, and
//! such a request's client is known to be gone ([`Peer::Gone`]) — it is not sent
//! upstream at all.
//!
//! Limits: on HTTP/2 it sees the whole connection go, not one stream's reset (actix-web
//! does not surface RST_STREAM to a response that is waiting for its body); Linux only
//! (elsewhere it never fires).

use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

/// How a connection's socket is found again, kept in the connection's data
/// (`on_connect`): no descriptor until a response asks for one, then one for the
/// connection, shared by its responses while any holds it.
#[derive(Clone, Debug)]
pub struct ConnFd {
    fd: RawFd,
    cookie: u64,
    /// The duplicate its responses share (many proxied watches on one HTTP/2 connection).
    dup: Arc<Mutex<Weak<OwnedFd>>>,
}

/// What [`ConnFd::socket`] found.
#[derive(Debug)]
pub enum Peer {
    /// The connection's socket (a duplicate of it).
    Socket(ConnSocket),
    /// The connection's socket is closed: its client is gone.
    Gone,
    /// Could not tell (no descriptor left to duplicate into, say): no hang-up check.
    Unknown,
}

impl ConnFd {
    /// `stream`'s descriptor number and socket cookie; none where there is no cookie
    /// (not Linux).
    pub fn of(stream: &impl AsFd) -> Option<Self> {
        let fd = stream.as_fd().as_raw_fd();
        Some(ConnFd {
            fd,
            cookie: cookie(fd).ok()?,
            dup: Arc::default(),
        })
    }

    /// The connection's socket, while it is open (a duplicate, shared by the
    /// connection's responses); [`Peer::Gone`] once it is closed, whether its number is
    /// free or another socket's by now.
    pub fn socket(&self) -> Peer {
        // A poisoned lock only means a panic elsewhere held it; the Weak is still whole.
        let mut shared = self.dup.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(fd) = shared.upgrade() {
            // A duplicate of this socket made earlier, still held by a response: this
            // socket whatever its number holds now.
            return Peer::Socket(ConnSocket(fd));
        }
        // Checked before duplicating, so another socket or file is not duplicated: only
        // a number that changed hands between this check and the next line is (closed
        // again at once below).
        match cookie(self.fd) {
            Ok(c) if c == self.cookie => {}
            Ok(_) => return Peer::Gone,
            Err(e) => return gone_or_unknown(&e),
        }
        // SAFETY: fcntl on a plain integer: a closed number fails (EBADF), any other is
        // duplicated into a new descriptor that this function owns from here on.
        let dup = unsafe { libc::fcntl(self.fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return gone_or_unknown(&io::Error::last_os_error());
        }
        // SAFETY: `dup` is a new descriptor nothing else owns.
        let owned = unsafe { OwnedFd::from_raw_fd(dup) };
        match cookie(owned.as_raw_fd()) {
            Ok(c) if c == self.cookie => {
                let fd = Arc::new(owned);
                *shared = Arc::downgrade(&fd);
                Peer::Socket(ConnSocket(fd))
            }
            Ok(_) => Peer::Gone,
            Err(e) => gone_or_unknown(&e),
        }
    }
}

/// A number that is closed, or no socket: the connection's socket is gone.
fn gone_or_unknown(e: &io::Error) -> Peer {
    match e.raw_os_error() {
        Some(libc::EBADF | libc::ENOTSOCK) => Peer::Gone,
        _ => Peer::Unknown,
    }
}

/// The socket cookie of descriptor number `fd` (`SO_COOKIE`, Linux 2.6.37+ for getting
/// it; unique for the kernel's uptime).
#[cfg(target_os = "linux")]
fn cookie(fd: RawFd) -> io::Result<u64> {
    // Linux's SO_COOKIE (include/uapi/asm-generic/socket.h), the same on the
    // architectures kcache is built for.
    const SO_COOKIE: libc::c_int = 57;
    let mut value: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `value`, a u64 of that size; a
    // number that is not an open socket fails (EBADF, ENOTSOCK) and writes nothing.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_COOKIE,
            (&mut value as *mut u64).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        Ok(value)
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn cookie(_fd: RawFd) -> io::Result<u64> {
    Err(io::ErrorKind::Unsupported.into())
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
    use std::net::{TcpListener, TcpStream};

    fn socket(c: &ConnFd) -> ConnSocket {
        match c.socket() {
            Peer::Socket(s) => s,
            other => panic!("expected the socket, got {other:?}"),
        }
    }

    fn pair(listener: &TcpListener) -> (TcpStream, TcpStream) {
        let client = TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (server, _) = listener.accept().expect("accept");
        (client, server)
    }

    #[test]
    fn a_closed_connection_is_gone_whoever_took_its_number() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let (_client, server) = pair(&listener);
        let conn = ConnFd::of(&server).expect("cookie");
        // Open: one duplicate, shared by the connection's responses.
        let (a, b) = (socket(&conn), socket(&conn));
        assert_eq!(a.0.as_raw_fd(), b.0.as_raw_fd());
        assert_ne!(a.0.as_raw_fd(), server.as_raw_fd());
        // Closed while a response holds the duplicate: still that socket.
        let number = server.as_raw_fd();
        drop(server);
        assert_eq!(socket(&conn).0.as_raw_fd(), a.0.as_raw_fd());
        drop((a, b));
        // Closed and not held: gone, whether the number is free...
        assert!(matches!(conn.socket(), Peer::Gone));
        // ...or another socket's (the lowest free number goes to the next one opened;
        // some other test's may take it first, and then it is free or theirs: gone too).
        let other = TcpListener::bind("127.0.0.1:0").expect("bind");
        let reused = other.as_raw_fd() == number;
        assert!(
            matches!(conn.socket(), Peer::Gone),
            "number reused: {reused}"
        );
        // A file on the number (the lowest free one again) is not a socket at all: gone.
        drop(other);
        let _file = std::fs::File::open("/proc/self/status").expect("open");
        assert!(matches!(conn.socket(), Peer::Gone));
    }

    #[test]
    fn a_peers_close_is_seen_without_reading_what_it_sent() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let (mut client, server) = pair(&listener);
        let sock = socket(&ConnFd::of(&server).expect("cookie"));
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

    #[test]
    fn a_reset_connection_is_still_its_socket_and_seen_closed() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let (client, server) = pair(&listener);
        let conn = ConnFd::of(&server).expect("cookie");
        // The client resets (SO_LINGER 0, then close): the server's socket has no peer
        // address any more, but it is still this connection's.
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: setsockopt reads `size_of::<linger>()` bytes from a valid linger.
        let rc = unsafe {
            libc::setsockopt(
                client.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&linger as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            )
        };
        assert_eq!(rc, 0);
        drop(client);
        std::thread::sleep(Duration::from_millis(50));
        let sock = socket(&conn);
        assert!(sock.peer_closed());
        drop(server);
    }
}
