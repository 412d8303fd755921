//! Why a definitions document was not imported, as a type: the document's own faults by JSON
//! path, the metadata's refusals, and a proposal that failed half-way. The gRPC adapter maps
//! each to one status (`api::definitions`); the boot import retries what
//! [`DefinitionsError::is_retryable`] says.

use std::fmt;

use qq_core::meta::{ErrorKind, MetaError};

use super::MAX_DEFINITIONS_BYTES;
use crate::error::NodeError;

#[derive(Debug, Clone, thiserror::Error)]
pub enum DefinitionsError {
    /// A field of the document is wrong: its JSON path (`queues[3].arguments.x-max-length`,
    /// `definitions_json` for the whole) and why.
    #[error("{path}: {reason}")]
    Invalid { path: String, reason: String },
    /// The document is larger than [`MAX_DEFINITIONS_BYTES`].
    #[error("definitions_json: {bytes} bytes, more than the bound of {MAX_DEFINITIONS_BYTES}")]
    TooLarge { bytes: usize },
    /// The metadata's own rules refuse items of the document; nothing was proposed. `kind`
    /// is the first refusal's, `refusals` lists them by path.
    #[error("definitions refused, nothing imported: {refusals}")]
    Refused { kind: ErrorKind, refusals: String },
    /// Proposing the item at `path` failed after `applied` changes of the import were made
    /// (someone changed the metadata since the check, or the group is unavailable).
    #[error(
        "{} (after {applied} changes of this import were applied)",
        Located(path, cause)
    )]
    Stopped {
        path: String,
        cause: Cause,
        applied: usize,
    },
}

/// Why a proposal of an import failed.
#[derive(Debug, Clone)]
pub enum Cause {
    /// The metadata group applied the command and refused it.
    Refused(MetaError),
    /// The command did not reach the group, or no answer came back.
    Node(NodeError),
}

impl DefinitionsError {
    /// A fault of the document at `path`.
    pub fn invalid(path: &str, reason: impl fmt::Display) -> DefinitionsError {
        DefinitionsError::Invalid {
            path: path.to_string(),
            reason: reason.to_string(),
        }
    }

    /// Whether the same import may succeed later unchanged (the metadata group was
    /// unavailable, or the node stopping).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            DefinitionsError::Stopped {
                cause: Cause::Node(NodeError::Unavailable(_) | NodeError::ShuttingDown),
                ..
            }
        )
    }
}

/// A metadata refusal of the item at `path`, named by it: an argument's error under
/// `path.arguments`, anything else after `path: `.
pub(super) struct Located<'a>(pub &'a str, pub &'a Cause);

impl fmt::Display for Located<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Located(path, cause) = self;
        match cause {
            Cause::Refused(e) if e.message.starts_with("x-") => {
                write!(f, "{path}.arguments.{}", e.message)
            }
            Cause::Refused(e) => write!(f, "{path}: {}", e.message),
            Cause::Node(e) => write!(f, "{path}: {e}"),
        }
    }
}
