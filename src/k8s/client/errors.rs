//! The client's error: what kind of failure a request met (the config, refused
//! credentials, a request they may not make, the API, a timeout, a conflict, an object that exists, a
//! resource not served).

#[derive(Debug, Clone, thiserror::Error)]
pub enum K8sError {
    #[error("{0}")]
    Config(String),
    /// 401: the credentials were rejected.
    #[error("{0}")]
    Unauthorized(String),
    /// 403: the credentials are accepted but not allowed this.
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    Api(String),
    /// The deadline passed, or the server did not answer in time.
    #[error("{0}")]
    Timeout(String),
    /// 409 Conflict: a resourceVersion or uid precondition failed.
    #[error("update conflict: {0}")]
    Conflict(String),
    /// 409 AlreadyExists.
    #[error("{0}")]
    AlreadyExists(String),
    /// 404 for the path itself (no object's NotFound): the API server
    /// serves no such group or resource.
    #[error("{0}: the API server serves no such resource")]
    NotServed(String),
}
