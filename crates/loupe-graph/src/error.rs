use loupe_tensor::TensorError;

/// Errors building, verifying or running a graph; each names the value involved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GraphError {
    #[error("graph verification failed at node {node} ('{name}', built at {location}): {reason}")]
    Verify {
        node: usize,
        name: String,
        location: String,
        reason: String,
    },
    #[error("op {op} computing '{name}' (built at {location}): {source}")]
    Kernel {
        op: &'static str,
        name: String,
        location: String,
        #[source]
        source: TensorError,
    },
    #[error("context overflow: {needed} tokens needed but the context window is {capacity}")]
    ContextOverflow { needed: usize, capacity: usize },
    #[error("invalid input: {0}")]
    Input(String),
}
