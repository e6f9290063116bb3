//! The harness's errors: each says what it was doing, so a failed run is
//! understood from its last line.

/// Why the harness could not run or finish a run. A safety violation is not
/// an error: it is a failed verdict in the report.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The command line asks for something impossible.
    #[error("{0}")]
    Usage(String),
    /// The test hosts (namespaces, bridge, routes) could not be set up.
    #[error("test hosts: {0}")]
    Setup(String),
    /// A file or directory of the run could not be read or written.
    #[error("{context}: {source}")]
    Io {
        /// What the harness was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The cluster under test misbehaved in a way that stops the run: a
    /// replica that exits on its own, a cluster that never elects a leader
    /// again once every fault is healed.
    #[error("cluster: {0}")]
    Cluster(String),
    /// A workload process failed to start or to record its history.
    #[error("worker: {0}")]
    Worker(String),
    /// The recorded histories could not be read back or merged.
    #[error("history: {0}")]
    History(String),
}

/// The harness's result type.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// A test-host error.
    pub fn setup(msg: impl Into<String>) -> Error {
        Error::Setup(msg.into())
    }

    /// A mapper from `io::Error` that says what was being done.
    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
        let context = context.into();
        move |source| Error::Io { context, source }
    }
}
