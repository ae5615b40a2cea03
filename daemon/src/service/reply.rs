//! How a refused request is answered: the error replies every handler builds, and the
//! caps on list lengths checked before anything is touched.

use crate::proto::{ErrorKind, Response};
use std::os::fd::OwnedFd;

/// What a handler returns: the reply and the fds it carries, or the error reply.
pub(super) type Reply = Result<(Response, Vec<OwnedFd>), Response>;

/// A reply that carries no fds.
pub(super) fn ok(r: Response) -> Reply {
    Ok((r, Vec::new()))
}

pub(super) fn err(kind: ErrorKind, message: impl Into<String>) -> Response {
    Response::Error { kind, message: message.into() }
}

pub(super) fn invalid(message: impl Into<String>) -> Response {
    err(ErrorKind::Invalid, message)
}

pub(super) fn from_obj(e: tutti_objstore::ObjError) -> Response {
    use tutti_objstore::ObjError;
    match e {
        ObjError::Invalid { .. } | ObjError::Unknown { .. } => invalid(e.to_string()),
        e => err(ErrorKind::Io, e.to_string()),
    }
}

pub(super) fn from_driver(e: tutti_driver::DriverError) -> Response {
    use tutti_driver::DriverError;
    match e {
        DriverError::NoQueuePair { .. } | DriverError::InUse(_) => err(ErrorKind::Busy, e.to_string()),
        DriverError::InvalidArgument(_) => invalid(e.to_string()),
        e => err(ErrorKind::Io, e.to_string()),
    }
}

/// Refuses a list of `n` `what` longer than `max`.
pub(super) fn cap(what: &str, n: usize, max: usize) -> Result<(), Response> {
    if n > max {
        return Err(invalid(format!("{n} {what}; at most {max} per request")));
    }
    Ok(())
}
