//! The stand-in's error type.

use cudarc::driver::sys::CUresult;

/// What went wrong: a driver call refused (with the `CUresult` it returns and
/// why), or the test-side wrapper unable to load the library.
#[derive(Debug, thiserror::Error)]
pub enum StandinError {
    #[error("{code:?}: {reason}")]
    Driver { code: CUresult, reason: String },

    #[error("the CUDA stand-in library: {0}")]
    Library(String),
}

impl StandinError {
    /// The `CUresult` a driver call returns for this error.
    pub fn code(&self) -> CUresult {
        match self {
            StandinError::Driver { code, .. } => *code,
            StandinError::Library(_) => CUresult::CUDA_ERROR_UNKNOWN,
        }
    }
}

/// A refused driver call.
pub(crate) fn fail(code: CUresult, reason: impl Into<String>) -> StandinError {
    StandinError::Driver { code, reason: reason.into() }
}

pub(crate) type Result<T> = std::result::Result<T, StandinError>;
