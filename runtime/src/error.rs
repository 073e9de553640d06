//! The runtime's error type. Kinds stay typed up to the wire: the shim maps
//! each variant (and each kind of store error) onto a ttrpc code.

/// What kind of failure the node's snapshot store (torpor-snapshotter)
/// answered with, or that reaching it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreErrorKind {
    /// The daemon is not running, not reachable, or timed out.
    Unavailable,
    /// The snapshot, staging or lease does not exist (any more).
    NotFound,
    /// The store refused the request's arguments.
    InvalidArgument,
    /// Another node holds the actor's lease (at acquire).
    LeaseHeld,
    /// This node lost the actor's lease (at confirm): another node took it.
    LeaseLost,
    /// Another precondition of the store failed (pinned elsewhere, busy...).
    FailedPrecondition,
    /// A snapshot failed verification (digest mismatch, garbled manifest).
    Corrupt,
    /// The daemon (an older torpor-snapshotter) lacks the operation.
    Unimplemented,
    /// Anything else the daemon reported.
    Other,
}

/// Errors of the torpor runtime.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A `torpor.dev/*` annotation (or another user-supplied value) is invalid.
    #[error("invalid annotation {key}={value:?}: {reason}")]
    InvalidAnnotation { key: String, value: String, reason: String },
    /// A request argument is invalid.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The container or process does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// The object exists already.
    #[error("already exists: {0}")]
    AlreadyExists(String),
    /// The operation is not valid in the current state.
    #[error("failed precondition: {0}")]
    FailedPrecondition(String),
    /// The actor is not in a state the lifecycle operation starts from
    /// (a resume of a RUNNING actor, a freeze of a SUSPENDED one): to a
    /// trigger, "nothing to do".
    #[error("failed precondition: {0}")]
    WrongState(String),
    /// An I/O error, with what was being done.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// A system call failed.
    #[error("{context}: {source}")]
    Sys {
        context: String,
        #[source]
        source: nix::Error,
    },
    /// runc (or CRIU underneath it) failed; `message` is the last error runc logged.
    #[error("runc {command} failed: {message}")]
    Runc { command: String, message: String },
    /// Local data failed verification (a rootfs changeset entry, an image).
    #[error("{0}")]
    Corrupt(String),
    /// The node's snapshot store answered with an error, or could not be reached.
    #[error("{}", store_display(*kind, message))]
    Store { kind: StoreErrorKind, message: String },
    /// A JSON document could not be read or written.
    #[error("{context}: {source}")]
    Json {
        context: String,
        #[source]
        source: serde_json::Error,
    },
}

fn store_display(kind: StoreErrorKind, message: &str) -> String {
    use StoreErrorKind::*;
    match kind {
        NotFound => format!("not found: {message}"),
        InvalidArgument => format!("invalid argument: {message}"),
        LeaseHeld | LeaseLost | FailedPrecondition => format!("failed precondition: {message}"),
        Unavailable | Corrupt | Unimplemented | Other => message.to_string(),
    }
}

impl Error {
    /// A store error of `kind`.
    pub fn store(kind: StoreErrorKind, message: impl Into<String>) -> Error {
        Error::Store { kind, message: message.into() }
    }

    /// Whether this is a store error of `kind`.
    pub fn is_store(&self, kind: StoreErrorKind) -> bool {
        matches!(self, Error::Store { kind: k, .. } if *k == kind)
    }

    /// The same error with what was being done in front of its message;
    /// its kind is kept. Errors without a message of their own (I/O,
    /// runc...) become `Other` store errors only when they came from the
    /// store; otherwise they keep their kind and gain the context.
    pub fn context(self, what: &str) -> Error {
        match self {
            Error::Corrupt(m) => Error::Corrupt(format!("{what}: {m}")),
            Error::Store { kind, message } => Error::Store { kind, message: format!("{what}: {message}") },
            Error::NotFound(m) => Error::NotFound(format!("{what}: {m}")),
            Error::FailedPrecondition(m) => Error::FailedPrecondition(format!("{what}: {m}")),
            Error::WrongState(m) => Error::WrongState(format!("{what}: {m}")),
            Error::InvalidArgument(m) => Error::InvalidArgument(format!("{what}: {m}")),
            Error::AlreadyExists(m) => Error::AlreadyExists(format!("{what}: {m}")),
            Error::Io { context, source } => Error::Io { context: format!("{what}: {context}"), source },
            Error::Sys { context, source } => Error::Sys { context: format!("{what}: {context}"), source },
            Error::Runc { command, message } => Error::Runc { command, message: format!("{message} ({what})") },
            Error::Json { context, source } => Error::Json { context: format!("{what}: {context}"), source },
            e @ Error::InvalidAnnotation { .. } => e,
        }
    }
}

/// Result alias of the runtime.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Adds context to I/O errors: `fs::read(p).io_context(|| format!("read {p:?}"))`.
pub trait IoContext<T> {
    fn io_context<F: FnOnce() -> String>(self, f: F) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn io_context<F: FnOnce() -> String>(self, f: F) -> Result<T> {
        self.map_err(|source| Error::Io { context: f(), source })
    }
}

impl<T> IoContext<T> for nix::Result<T> {
    fn io_context<F: FnOnce() -> String>(self, f: F) -> Result<T> {
        self.map_err(|source| Error::Sys { context: f(), source })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_errors_keep_their_kind_through_context() {
        let e = Error::store(StoreErrorKind::LeaseLost, "actor a is held by node-b").context("resume of actor a");
        assert!(e.is_store(StoreErrorKind::LeaseLost));
        assert_eq!(e.to_string(), "failed precondition: resume of actor a: actor a is held by node-b");
        let e = Error::store(StoreErrorKind::NotFound, "no snapshot a@3");
        assert_eq!(e.to_string(), "not found: no snapshot a@3");
        assert!(!e.is_store(StoreErrorKind::LeaseLost));
        let e = Error::WrongState("actor a is RUNNING, not SUSPENDED or FROZEN".into()).context("resume");
        assert!(matches!(e, Error::WrongState(_)));
    }
}
