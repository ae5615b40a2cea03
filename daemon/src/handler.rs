//! What the daemon does with its clients, as the socket layer sees it: the [`Handler`] the
//! server and each connection's thread call.

use crate::peer::PeerCred;
use std::os::fd::OwnedFd;

/// What the daemon does with clients. The server calls it from one thread per client;
/// requests of one client come in order, requests of different clients concurrently.
pub trait Handler: Send + Sync + 'static {
    type Req: serde::de::DeserializeOwned + Send;
    type Resp: serde::Serialize + Send;
    /// A new client connected (after the access check). Returns its id, or a refusal message.
    fn connect(&self, peer: &PeerCred) -> Result<u64, String>;
    /// One request of client `client`; `fds` came with it. Returns the reply and fds to send with it.
    fn request(
        &self,
        client: u64,
        peer: &PeerCred,
        req: Self::Req,
        fds: Vec<OwnedFd>,
    ) -> (Self::Resp, Vec<OwnedFd>);
    /// Reply to a frame that could not be decoded (so the peer gets a clear error, not silence).
    fn malformed(&self, client: u64, why: &str) -> Self::Resp;
    /// The client is gone (closed, crashed, or dropped for a protocol error): release everything it held.
    fn disconnect(&self, client: u64);
    /// Whether a connection must say hello before it counts as a client: its first request must
    /// make [`greeted`](Self::greeted) true, or it is answered and closed; until then it is held
    /// to the hello deadlines and counted apart from the clients. By default every connection
    /// is a client at once.
    fn hello_first(&self) -> bool {
        false
    }
    /// Whether `client` has said hello and was accepted (asked only when `hello_first`).
    fn greeted(&self, _client: u64) -> bool {
        true
    }
    /// Reply that refuses a request for a reason of the server's (the client limit reached at
    /// hello, a hello deadline passed) before the connection is closed.
    fn refusal(&self, client: u64, why: &str) -> Self::Resp {
        self.malformed(client, why)
    }
}
