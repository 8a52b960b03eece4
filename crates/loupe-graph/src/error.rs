use loupe_tensor::TensorError;

/// Errors building, verifying or running a graph; each names the value involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GraphError {
    #[error("graph verification failed at node {node} ('{name}', built at {location}): {reason}")]
    Verify { node: usize, name: String, location: String, reason: String },
    #[error("op {op} computing '{name}' (built at {location}): {source}")]
    Kernel {
        op: &'static str,
        name: String,
        location: String,
        #[source]
        source: TensorError,
    },
    #[error("nan-check: op {op} computing '{name}' (built at {location}) produced {nans} NaN and {infs} Inf among {len} values; first at [token {}, feature {}]", first.0, first.1)]
    NanCheck {
        op: &'static str,
        name: String,
        location: String,
        nans: usize,
        infs: usize,
        len: usize,
        first: (usize, usize),
    },
    #[error("uninitialized-read-check: op {op} computing '{name}' (built at {location}) reads {poisoned} of {len} values of {input} never written; first at index {first}")]
    UninitializedRead {
        op: &'static str,
        name: String,
        location: String,
        /// `'name' (built at file:line:col)`: one string keeps the error small.
        input: String,
        poisoned: usize,
        len: usize,
        first: usize,
    },
    #[error("assert-level: op {op} computing '{name}' (built at {location}): {detail}")]
    Assert { op: &'static str, name: String, location: String, detail: String },
    #[error("context overflow: {needed} tokens needed but the context window is {capacity}")]
    ContextOverflow { needed: usize, capacity: usize },
    #[error("invalid input: {0}")]
    Input(String),
}

impl GraphError {
    /// The model-code source location of the op the error is about, if it names one.
    pub fn location(&self) -> Option<&str> {
        match self {
            GraphError::Verify { location, .. }
            | GraphError::Kernel { location, .. }
            | GraphError::NanCheck { location, .. }
            | GraphError::UninitializedRead { location, .. }
            | GraphError::Assert { location, .. } => Some(location),
            GraphError::ContextOverflow { .. } | GraphError::Input(_) => None,
        }
    }
}
