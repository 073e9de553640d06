//! The crate's error type.

/// What went wrong in the agent or the plugin.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A call to the API server failed.
    #[error("{what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: kube::Error,
    },
    /// The kubeconfig or in-cluster configuration could not be loaded.
    #[error("Kubernetes client configuration: {0}")]
    Config(String),
    /// The node's control sockets could not be listed.
    #[error("{0}")]
    Node(String),
    /// A command-line argument is wrong.
    #[error("{0}")]
    Usage(String),
    /// A wait ended without the state asked for.
    #[error("{0}")]
    Wait(String),
    /// I/O (the async runtime, a signal handler).
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    pub fn kube(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
        let what = what.into();
        move |source| Error::Kube { what, source }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
