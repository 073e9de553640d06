//! The runtime's error type. The shim maps each variant onto a ttrpc code.

/// Errors of the torpor runtime.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A `torpor.dev/*` annotation (or another user-supplied value) is invalid.
    #[error("invalid annotation {key}={value:?}: {reason}")]
    InvalidAnnotation {
        key: String,
        value: String,
        reason: String,
    },
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
    /// The other side (an older torpor-snapshotter) lacks the operation.
    #[error("{0}")]
    Unimplemented(String),
    /// A snapshot failed verification (digest mismatch, truncated manifest...).
    #[error("{0}")]
    Corrupt(String),
    /// The node's snapshot store (torpor-snapshotter) is unreachable or failed.
    #[error("{0}")]
    Store(String),
    /// A JSON document could not be read or written.
    #[error("{context}: {source}")]
    Json {
        context: String,
        #[source]
        source: serde_json::Error,
    },
}

/// Result alias of the runtime.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Adds context to I/O errors: `fs::read(p).io_context(|| format!("read {p:?}"))`.
pub trait IoContext<T> {
    fn io_context<F: FnOnce() -> String>(self, f: F) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn io_context<F: FnOnce() -> String>(self, f: F) -> Result<T> {
        self.map_err(|source| Error::Io {
            context: f(),
            source,
        })
    }
}

impl<T> IoContext<T> for nix::Result<T> {
    fn io_context<F: FnOnce() -> String>(self, f: F) -> Result<T> {
        self.map_err(|source| Error::Sys {
            context: f(),
            source,
        })
    }
}
